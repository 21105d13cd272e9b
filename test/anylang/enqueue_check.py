#!/usr/bin/env python3
"""The Python side of the cross-language tests: psycopg 3 (Debian's
python3-psycopg) enqueues pgoutbox effects inside its own transactions
through the SQL API. test/anylang runs it with DATABASE_URL set to a fresh,
migrated database holding the table records; a Go worker then delivers
what it committed. Exits non-zero, naming the failed check, on any
disagreement."""

import hashlib
import os
import sys

import psycopg
from psycopg.types.json import Json


def key(*parts):
    """pgoutbox.Key: the hex SHA-256 of the parts joined by '|' (UTF-8)."""
    return hashlib.sha256("|".join(parts).encode("utf-8")).hexdigest()


def counts(conn):
    return conn.execute(
        "SELECT (SELECT count(*) FROM pgoutbox.effects), (SELECT count(*) FROM pgoutbox.effect_keys),"
        " (SELECT count(*) FROM records)"
    ).fetchone()


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def enqueue(conn, queue, effect_type, idem_key, payload=None):
    return conn.execute(
        "SELECT pgoutbox.enqueue(%s, %s, %s, %s)",
        (queue, effect_type, idem_key, None if payload is None else Json(payload)),
    ).fetchone()[0]


def main():
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        # The key, in Python, in SQL and in Go (pgoutbox.Key's value).
        check(key("record.upsert", "r1", "abc") == "2a5a1e8b2700f55097b2719c36cf6821768cac8601913fa1cebddbefdb0968ee",
              "hashlib key equals Go's Key")
        for parts in ([], ["a|b", "c"], ["ünï", "中文"]):
            sql_key = conn.execute("SELECT pgoutbox.key(VARIADIC %s::text[])", (parts,)).fetchone()[0]
            check(sql_key == key(*parts), f"pgoutbox.key{tuple(parts)} equals hashlib's")

        # Rolled back: neither the record nor its effect.
        before = counts(conn)
        rolled = key("record.upsert", "py-rolled-back", "v1")
        with conn.transaction(force_rollback=True):
            conn.execute("INSERT INTO records (id, title) VALUES ('py-rolled-back', 'Never')")
            enqueue(conn, "anylang", "record.upsert", rolled, {"id": "py-rolled-back"})
        check(counts(conn) == before, "a rolled-back transaction leaves nothing")

        # Committed: the record and its effect, delivered later by Go.
        with conn.transaction():
            conn.execute("INSERT INTO records (id, title) VALUES ('py-1', 'From Python')")
            eid = enqueue(conn, "anylang", "record.upsert", key("record.upsert", "py-1", "v1"),
                          {"id": "py-1", "title": "From Python"})
        row = conn.execute("SELECT id, payload FROM pgoutbox.effects WHERE idempotency_key = %s",
                           (key("record.upsert", "py-1", "v1"),)).fetchone()
        check(row == (eid, {"id": "py-1", "title": "From Python"}), "the committed effect is stored as given")

        # The batch form, a repeated key included, in one transaction.
        with conn.transaction():
            conn.execute("INSERT INTO records (id, title) VALUES ('py-2', 'Two')")
            ids = [r[1] for r in conn.execute(
                "SELECT idx, id FROM pgoutbox.enqueue_batch(%s) ORDER BY idx",
                (Json([
                    {"queue": "anylang", "effect_type": "record.upsert",
                     "idempotency_key": key("record.upsert", "py-2", "v1"), "payload": {"id": "py-2"}},
                    {"queue": "anylang", "effect_type": "record.upsert",
                     "idempotency_key": key("record.upsert", "py-1", "v1")},
                ]),),
            ).fetchall()]
        check(len(ids) == 2 and ids[1] == eid, "the batch returns the existing id for a key already enqueued")

        # Refusals carry their SQLSTATE and write nothing.
        for name, args, sqlstate in (
            ("credential key", ("anylang", "t", "k", {"auth": {"token": "s3cr3t"}}), "OB003"),
            ("oversized payload", ("anylang", "t", "k", {"blob": "x" * 65536}), "OB002"),
            ("bad queue name", ("", "t", "k", None), "OB001"),
        ):
            before = counts(conn)
            try:
                with conn.transaction():
                    conn.execute("INSERT INTO records (id, title) VALUES ('py-bad', 'bad')")
                    enqueue(conn, *args)
                check(False, f"{name} is refused")
            except psycopg.Error as e:
                check(e.sqlstate == sqlstate and "s3cr3t" not in str(e),
                      f"{name} is refused with {sqlstate}: {e.diag.message_primary}")
            check(counts(conn) == before, f"{name} writes nothing")


if __name__ == "__main__":
    main()
