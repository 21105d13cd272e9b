#!/usr/bin/env python3
"""A pgoutbox worker in Python (psycopg 3) on the SQL worker functions
(docs/any-language.md, "Workers"). One effect at a time per process (run
more processes for more): it claims under a durable lease, marks a
non-replay-safe delivery started before its handler runs, extends the
lease from a second thread while the handler runs, records the outcome,
recovers the queue's expired leases, and wakes on NOTIFY with a poll
fallback. On a batch storage queue it delivers its replay-safe types a
page at a time from the batch (claim_batch, settle_batch: no row written
per effect delivered; docs/any-language.md, "Batch workers"), and the
rest through the row claim. The database enforces every rule; the role
needs pgoutbox_worker and pgoutbox.grant_work on the queue.

Run it: DATABASE_URL=... QUEUE=... python3 worker_example.py (it prints each
record.upsert effect it delivers; POLL_SECONDS sets the poll fallback).
"""

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from datetime import timedelta

import psycopg


class Retry(Exception):
    """A transient failure; nothing was delivered. Retried with backoff."""


class RetryAfter(Exception):
    """Retry no earlier than seconds from now (a Retry-After header)."""

    def __init__(self, seconds, message):
        super().__init__(message)
        self.seconds = seconds


class Permanent(Exception):
    """A permanent failure: dead-lettered now."""


class Ambiguous(Exception):
    """The request may have been processed: retried when replay-safe, else
    reconciliation_required."""


def classify(err, replay_safe):
    """The outcome, retry_after and recorded error text of a handler's
    exception (Go's classify; the text as Go's OutcomeError prints it)."""
    if isinstance(err, RetryAfter):
        return "retry_after", timedelta(seconds=err.seconds), f"{err} (retry after {err.seconds}s)"
    for cls, outcome in ((Retry, "retry"), (Permanent, "permanent"), (Ambiguous, "ambiguous")):
        if isinstance(err, cls):
            return outcome, None, f"{err} ({outcome})"
    return ("retry" if replay_safe else "ambiguous"), None, str(err)


class Extender(threading.Thread):
    """Extends the lease of the delivery in flight, or of the batch page in
    delivery, every lease / 3; a batch lease it cannot extend is lost."""

    def __init__(self, conninfo, lease):
        super().__init__(daemon=True)
        self.conn = psycopg.connect(conninfo, autocommit=True)
        self.lease, self.fence, self.batch, self.lock = lease, None, None, threading.Lock()
        self.lost = threading.Event()
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(self.lease.total_seconds() / 3):
            with self.lock:
                if self.fence:
                    i, token, effect_type = self.fence
                    self.conn.execute(
                        "SELECT * FROM pgoutbox.extend(%s, %s, %s, %s)", ([i], [token], [effect_type], self.lease)
                    )
                if self.batch and not self.conn.execute(
                        "SELECT pgoutbox.extend_batch(%s, %s, %s, %s)", (*self.batch, self.lease)).fetchone()[0]:
                    self.lost.set()


def deliver(conn, extender, row, handlers, backoff_cap):
    """Delivers one claimed effect and records its outcome."""
    effect_id, effect_type, key, payload, attempt, max_attempts, token = row
    fence = (effect_id, token, effect_type)
    replay_safe, handler = handlers.get(effect_type, (True, None))
    err = None
    if handler is None:
        err = Retry(f'no handler registered for effect type "{effect_type}"')
    else:
        # Committed (autocommit) before the handler runs: from now on an
        # unknown outcome is reconciliation_required, never a second delivery.
        if not replay_safe and not conn.execute("SELECT pgoutbox.mark_started(%s, %s, %s)", fence).fetchone()[0]:
            return  # the lease was lost: deliver nothing
        with extender.lock:
            extender.fence = fence
        try:
            handler(effect_id, key, payload, attempt, max_attempts)
        except Exception as e:  # noqa: BLE001 (every failure is routed)
            err = e
        finally:
            with extender.lock:
                extender.fence = None
    if err is None:
        conn.execute("SELECT pgoutbox.complete(%s, %s, %s)", fence)
        return
    outcome, after, text = classify(err, replay_safe)
    conn.execute(
        "SELECT pgoutbox.fail(%s, %s, %s, %s, %s, %s, %s, %s)",
        (*fence, outcome, text[:2000], replay_safe, after, backoff_cap),
    )


class Page:
    """Sizes batch pages: as many effects as the handlers' recent pace runs
    in half of hold, from 1 to most."""

    def __init__(self, most, hold):
        self.most, self.hold, self.pace = most, hold, None

    def size(self):
        if self.pace is None:
            return 1
        return max(1, min(self.most, int(self.hold / 2 / max(self.pace, 1e-6))))

    def ran(self, seconds):
        self.pace = seconds if self.pace is None else 0.8 * self.pace + 0.2 * seconds


def deliver_page(conn, extender, queue, worker, rows, handlers, backoff_cap, page, stop):
    """Delivers a batch page (the rows of one claim_batch), one effect after
    another until page.hold has passed, and settles it in one call: the
    effects not started then move unrun to the row storage."""
    batch_id, token, through = rows[0][:3]
    extender.lost.clear()
    with extender.lock:
        extender.batch = (queue, batch_id, token)
    delivered, failed, outcomes, errors, afters = [], [], [], [], []
    deadline = time.monotonic() + page.hold
    try:
        for row in rows:
            if stop.is_set() or extender.lost.is_set() or time.monotonic() >= deadline:
                break
            effect_id, effect_type, key, payload, attempt, max_attempts = row[3:]
            started = time.monotonic()
            try:
                handlers[effect_type][1](effect_id, key, payload, attempt, max_attempts)
                delivered.append(effect_id)
            except Exception as e:  # noqa: BLE001 (every failure is routed)
                outcome, after, text = classify(e, True)
                failed.append(effect_id)
                outcomes.append(outcome)
                errors.append(text[:2000])
                afters.append(after)
            page.ran(time.monotonic() - started)
    finally:
        with extender.lock:
            extender.batch = None
    if extender.lost.is_set():
        return  # another worker took the batch over: the outcomes are not ours
    conn.execute(
        "SELECT pgoutbox.settle_batch(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (queue, batch_id, token, through, worker, delivered, failed, outcomes, errors,
         afters if any(a is not None for a in afters) else [], backoff_cap),
    )


def work(conninfo, queue, handlers, stop, lease=timedelta(seconds=30), poll=1.0,
         backoff_cap=timedelta(seconds=300), recover_every=5.0, ready=None, page_size=100, page_hold=1.0):
    """Works queue until stop (a threading.Event) is set. handlers maps an
    effect type to (replay_safe, fn(id, key, payload, attempt, max_attempts));
    ready, when given, is called once, when the worker first waits (it
    listens, and found nothing to claim). On a batch storage queue the
    replay-safe types are delivered from the batch in pages of at most
    page_size effects, each settled within about page_hold seconds (a
    handler that runs longer holds its page until it returns)."""
    worker = f"{socket.gethostname()}-{os.getpid()}-py"
    safe = sorted(t for t, (replay_safe, _) in handlers.items() if replay_safe)
    page = Page(page_size, page_hold)
    extender = Extender(conninfo, lease)
    extender.start()
    with psycopg.connect(conninfo, autocommit=True) as conn, \
            psycopg.connect(conninfo, autocommit=True) as listen:
        listen.execute("LISTEN pgoutbox_effects")
        recovered = 0.0
        while not stop.is_set():
            if time.monotonic() - recovered >= recover_every:
                conn.execute("SELECT count(*) FROM pgoutbox.recover_expired(%s)", (queue,))
                recovered = time.monotonic()
            rows = conn.execute(
                "SELECT batch_id, batch_token, through, id, effect_type, idempotency_key, payload, attempt,"
                " max_attempts FROM pgoutbox.claim_batch(%s, %s, %s, %s, %s)",
                (queue, worker, safe, page.size(), lease)).fetchall() if safe else []
            if rows:
                deliver_page(conn, extender, queue, worker, rows, handlers, backoff_cap, page, stop)
            # Then one effect of the row storage (retries, other types), so
            # that a backlog of pages does not starve it. A worker that
            # delivers the batches claims rows only: claim would otherwise
            # move the stream's pages into rows.
            row = conn.execute(
                "SELECT id, effect_type, idempotency_key, payload, attempt, max_attempts, lease_token"
                " FROM pgoutbox.claim(%s, %s, 1, %s, %s)", (queue, worker, lease, not safe)).fetchone()
            if row:
                deliver(conn, extender, row, handlers, backoff_cap)
            if rows or row:
                continue
            # Nothing to do: wait for a notification, or poll.
            if ready:
                ready()
                ready = None
            # (In slices of at most half a second, so a stop is seen soon.)
            deadline = time.monotonic() + poll
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                if select.select([listen.fileno()], [], [], min(left, 0.5))[0]:
                    listen.execute("SELECT 1")  # reads (and drops) the notifications
                    break
    extender.done.set()


if __name__ == "__main__":
    def show(effect_id, key, payload, attempt, max_attempts):
        print(f"effect {effect_id} ({key}), attempt {attempt}: {json.dumps(payload)}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    work(os.environ["DATABASE_URL"], os.environ.get("QUEUE", "default"),
         {"record.upsert": (True, show)}, stop, poll=float(os.environ.get("POLL_SECONDS", "1")),
         ready=lambda: print("listening", flush=True))
    sys.exit(0)
