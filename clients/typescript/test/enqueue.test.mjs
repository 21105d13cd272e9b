// The TypeScript side of the cross-language tests. `npm test` runs it on any
// database pgoutbox's migrations have been applied to (DATABASE_URL): the
// suite creates its own table, records, when it is missing. test/anylang runs
// it on a fresh database after enqueueing an effect from Go under the key
// key("record.upsert", "shared", "v1"); run alone, the suite enqueues that key
// first through the SQL API, standing in for Go; then a Go worker delivers
// what these tests committed. Every test that needs the database fails, not
// skips, without DATABASE_URL.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";

import {
  enqueue,
  enqueueBatch,
  enqueueStatement,
  isRefusal,
  key,
  MAX_PAYLOAD_BYTES,
  SQLState,
} from "../dist/index.js";

const url = process.env.DATABASE_URL;
let pool;

before(async () => {
  assert.ok(url, "DATABASE_URL must name a database with pgoutbox's migrations applied (test/anylang sets it)");
  pool = new pg.Pool({ connectionString: url, max: 4 });
  await pool.query("CREATE TABLE IF NOT EXISTS records (id text PRIMARY KEY, title text NOT NULL)");
});

after(async () => {
  await pool?.end();
});

// inTransaction runs fn(client) between BEGIN and COMMIT, or ROLLBACK when
// fn throws (then it rethrows).
async function inTransaction(fn) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const out = await fn(client);
    await client.query("COMMIT");
    return out;
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  } finally {
    client.release();
  }
}

async function counts() {
  const { rows } = await pool.query(`SELECT
      (SELECT count(*) FROM pgoutbox.effects)::int AS effects,
      (SELECT count(*) FROM pgoutbox.effect_keys)::int AS keys,
      (SELECT count(*) FROM records)::int AS records`);
  return rows[0];
}

async function effectByKey(k) {
  const { rows } = await pool.query(
    "SELECT id::text AS id, queue, effect_type, payload, max_attempts FROM pgoutbox.effects WHERE idempotency_key = $1",
    [k],
  );
  return rows;
}

test("key equals Go's Key", () => {
  // pgoutbox.Key("record.upsert", "r1", "abc") (ExampleKey_sql in Go).
  assert.equal(key("record.upsert", "r1", "abc"), "2a5a1e8b2700f55097b2719c36cf6821768cac8601913fa1cebddbefdb0968ee");
  assert.notEqual(key("a", "b"), key("a", "c"));
  assert.throws(() => key("a", 1), TypeError);
});

test("key equals SQL's pgoutbox.key on any parts", async () => {
  for (const parts of [[], [""], ["a|b", "c"], ["a", "b|c"], ["ünï", "中文", "🙂"], ["record.upsert", "r1", "abc"]]) {
    const { rows } = await pool.query("SELECT pgoutbox.key(VARIADIC $1::text[]) AS k", [parts]);
    assert.equal(key(...parts), rows[0].k, `parts ${JSON.stringify(parts)}`);
  }
});

test("a rolled-back transaction leaves neither the domain row nor the effect", async () => {
  const before = await counts();
  const k = key("record.upsert", "ts-rolled-back", "v1");
  await assert.rejects(
    inTransaction(async (tx) => {
      await tx.query("INSERT INTO records (id, title) VALUES ($1, $2)", ["ts-rolled-back", "Never"]);
      const id = await enqueue(tx, { queue: "anylang", type: "record.upsert", key: k, payload: { id: "ts-rolled-back" } });
      assert.match(id, /^\d+$/);
      throw new Error("the request failed after the enqueue");
    }),
    /the request failed/,
  );
  assert.deepEqual(await counts(), before);
  assert.deepEqual(await effectByKey(k), []);
});

test("a committed transaction holds the domain row and its effect", async () => {
  const k = key("record.upsert", "ts-1", "v1");
  const id = await inTransaction(async (tx) => {
    await tx.query("INSERT INTO records (id, title) VALUES ($1, $2)", ["ts-1", "From TypeScript"]);
    return enqueue(tx, {
      queue: "anylang",
      type: "record.upsert",
      key: k,
      payload: { id: "ts-1", title: "From TypeScript", tags: ["a", "é"] },
      maxAttempts: 5,
    });
  });
  const rows = await effectByKey(k);
  assert.equal(rows.length, 1);
  assert.equal(rows[0].id, id);
  assert.deepEqual(rows[0].payload, { id: "ts-1", title: "From TypeScript", tags: ["a", "é"] });
  assert.equal(rows[0].max_attempts, 5);
  const { rows: rec } = await pool.query("SELECT title FROM records WHERE id = 'ts-1'");
  assert.deepEqual(rec, [{ title: "From TypeScript" }]);
});

test("enqueueBatch writes in one statement, ids in input order, a repeated key once", async () => {
  const before = await counts();
  const ids = await inTransaction(async (tx) => {
    await tx.query("INSERT INTO records (id, title) VALUES ('ts-2', 'Two'), ('ts-3', 'Three')");
    return enqueueBatch(tx, [
      { queue: "anylang", type: "record.upsert", key: key("record.upsert", "ts-3", "v1"), payload: { id: "ts-3" } },
      { queue: "anylang", type: "record.upsert", key: key("record.upsert", "ts-2", "v1"), payload: { id: "ts-2" } },
      { queue: "anylang", type: "record.upsert", key: key("record.upsert", "ts-3", "v1"), payload: { id: "ignored" } },
    ]);
  });
  assert.equal(ids.length, 3);
  assert.equal(ids[0], ids[2]);
  assert.notEqual(ids[0], ids[1]);
  const after = await counts();
  assert.equal(after.effects, before.effects + 2);
  assert.equal(after.keys, before.keys + 2);
  assert.deepEqual((await effectByKey(key("record.upsert", "ts-3", "v1")))[0].payload, { id: "ts-3" });
});

test("the key Go enqueued is one effect: TypeScript gets its id and writes nothing", async () => {
  const k = key("record.upsert", "shared", "v1");
  if ((await effectByKey(k)).length === 0) {
    // Run alone (npm test): enqueue the key the way Go would, through the SQL API.
    await pool.query("SELECT pgoutbox.enqueue('anylang', 'record.upsert', $1, $2::text::json)", [k, '{"from": "go"}']);
  }
  const existing = await effectByKey(k);
  assert.equal(existing.length, 1, "the key is enqueued once (by Go in test/anylang, else above)");
  const before = await counts();
  const id = await inTransaction((tx) =>
    enqueue(tx, { queue: "anylang", type: "record.upsert", key: k, payload: { from: "typescript" } }),
  );
  assert.equal(id, existing[0].id);
  assert.deepEqual(await counts(), before);
  assert.deepEqual((await effectByKey(k))[0].payload, existing[0].payload);
});

test("bad input is refused with the SQL error and writes nothing", async () => {
  const cases = [
    {
      name: "oversized payload",
      effect: { payload: { blob: "x".repeat(MAX_PAYLOAD_BYTES) } },
      code: SQLState.PayloadTooLarge,
      message: /payload is 65547 bytes, over the 65536-byte limit/,
    },
    {
      name: "credential key",
      effect: { payload: { user: { name: "ada", password: "hunter2" } } },
      code: SQLState.CredentialKey,
      message: /payload key \$\.user\.password looks like a credential/,
    },
    { name: "empty queue", effect: { queue: "" }, code: SQLState.InvalidEffect, message: /queue must be 1-128 bytes/ },
    { name: "blank queue", effect: { queue: " \t" }, code: SQLState.InvalidEffect, message: /queue must be 1-128 bytes/ },
    { name: "long queue", effect: { queue: "q".repeat(129) }, code: SQLState.InvalidEffect, message: /queue must be 1-128 bytes/ },
    { name: "max attempts", effect: { maxAttempts: 1001 }, code: SQLState.InvalidEffect, message: /max_attempts must be between/ },
  ];
  for (const c of cases) {
    for (const form of ["enqueue", "enqueueBatch"]) {
      const before = await counts();
      const effect = { queue: "anylang", type: "record.upsert", key: key("bad", c.name), ...c.effect };
      const err = await inTransaction(async (tx) => {
        await tx.query("INSERT INTO records (id, title) VALUES ($1, 'bad')", [`bad-${c.name}`]);
        await (form === "enqueue" ? enqueue(tx, effect) : enqueueBatch(tx, [effect]));
      }).then(
        () => assert.fail(`${c.name} (${form}): accepted`),
        (e) => e,
      );
      assert.ok(isRefusal(err, c.code), `${c.name} (${form}): ${err.code} ${err.message}, want ${c.code}`);
      assert.ok(isRefusal(err));
      assert.match(err.message, c.message, `${c.name} (${form})`);
      assert.doesNotMatch(err.message, /hunter2/, "the message names the key, never the value");
      assert.deepEqual(await counts(), before, `${c.name} (${form}) wrote something`);
    }
  }
});

test("a role that may not enqueue the type is refused with NotAuthorized and writes nothing", async () => {
  // A role of the enqueuer group without a grant for this queue and type
  // (docs/any-language.md, "Grants"); roles are the cluster's, so create
  // it once and leave it.
  await pool.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgoutbox_ts_ungranted') THEN
        CREATE ROLE pgoutbox_ts_ungranted NOLOGIN;
      END IF;
    END $$`);
  await pool.query("GRANT pgoutbox_enqueuer TO pgoutbox_ts_ungranted");
  for (const form of ["enqueue", "enqueueBatch"]) {
    const before = await counts();
    const effect = { queue: "anylang-ungranted", type: "record.upsert", key: key("ungranted", form) };
    const err = await inTransaction(async (tx) => {
      await tx.query("SET LOCAL ROLE pgoutbox_ts_ungranted");
      await (form === "enqueue" ? enqueue(tx, effect) : enqueueBatch(tx, [effect]));
    }).then(
      () => assert.fail(`${form}: an ungranted role enqueued`),
      (e) => e,
    );
    assert.ok(isRefusal(err, SQLState.NotAuthorized), `${form}: ${err.code} ${err.message}, want ${SQLState.NotAuthorized}`);
    assert.match(err.message, /role "pgoutbox_ts_ungranted" may not enqueue effect type "record.upsert" into queue "anylang-ungranted"/);
    assert.deepEqual(await counts(), before, `${form} wrote something`);
  }
});

test("a batch with one bad effect writes none of its effects", async () => {
  const before = await counts();
  const err = await inTransaction((tx) =>
    enqueueBatch(tx, [
      { queue: "anylang", type: "record.upsert", key: key("fine") },
      { queue: "anylang", type: "record.upsert", key: key("bad"), payload: { apiKey: "k" } },
    ]),
  ).catch((e) => e);
  assert.equal(err.code, SQLState.CredentialKey);
  assert.match(err.message, /^pgoutbox: effect 1: payload key \$\.apiKey/);
  assert.deepEqual(await counts(), before);
});

test("a Pool is refused: its queries would run outside the transaction", async () => {
  const before = await counts();
  await assert.rejects(enqueue(pool, { queue: "anylang", type: "t", key: "pool" }), TypeError);
  await assert.rejects(enqueueBatch(pool, [{ queue: "anylang", type: "t", key: "pool" }]), TypeError);
  await assert.rejects(enqueue(null, { queue: "anylang", type: "t", key: "pool" }), TypeError);
  assert.deepEqual(await counts(), before);
});

test("values JSON cannot carry are refused before the database", async () => {
  const client = await pool.connect();
  try {
    assert.deepEqual(await enqueueBatch(client, []), []);
    await assert.rejects(enqueue(client, { queue: "q", type: "t", key: "k", payload: () => 1 }), TypeError);
    await assert.rejects(enqueue(client, { queue: "q", type: "t", key: "k", payload: { n: 1n } }), TypeError);
    await assert.rejects(enqueue(client, { queue: "q", type: "t", key: "k", maxAttempts: NaN }), TypeError);
    await assert.rejects(enqueueBatch(client, [{ queue: "q", type: "t", key: "k", maxAttempts: 2.5 }]), TypeError);
    await assert.rejects(enqueue(client, { queue: "q", type: "t", key: "k", availableAt: new Date("nope") }), TypeError);
    await assert.rejects(enqueueBatch(client, [{ queue: "q", type: "t", key: "k", delayMs: Infinity }]), TypeError);
  } finally {
    client.release();
  }
});

test("enqueueStatement serves drivers other than node-postgres", () => {
  const at = new Date("2030-01-02T03:04:05.000Z");
  const st = enqueueStatement({ queue: "q", type: "t", key: "k", payload: { a: 1 }, maxAttempts: 3, availableAt: at });
  assert.match(st.text, /^SELECT pgoutbox\.enqueue\(\$1, \$2, \$3, \$4::text::json, \$5::integer, \$6::timestamptz, \$7::interval, \$8::text\)/);
  assert.deepEqual(st.values, ["q", "t", "k", '{"a":1}', 3, "2030-01-02T03:04:05.000Z", null, null]);
});

test("orderingKey reaches the rows of both forms", async () => {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await enqueue(client, { queue: "ordered", type: "t", key: "one", orderingKey: "record-1" });
    await enqueueBatch(client, [
      { queue: "ordered", type: "t", key: "two", orderingKey: "record-1" },
      { queue: "ordered", type: "t", key: "three" },
    ]);
    const { rows } = await client.query(`SELECT ordering_key FROM pgoutbox.effects WHERE queue = 'ordered' ORDER BY id`);
    assert.deepEqual(rows.map((r) => r.ordering_key), ["record-1", "record-1", null]);
  } finally {
    await client.query("ROLLBACK");
    client.release();
  }
});

test("availableAt, delayMs and maxAttempts reach the rows of both forms", async () => {
  const before = await counts();
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const at = new Date("2031-02-03T04:05:06.789Z");
    const one = await enqueue(client, { queue: "later", type: "t", key: "one", availableAt: at, maxAttempts: 2 });
    const [two, three, four] = await enqueueBatch(client, [
      { queue: "later", type: "t", key: "two", availableAt: "2031-02-03T04:05:06.789Z", maxAttempts: 3 },
      { queue: "later", type: "t", key: "three", payload: null },
      { queue: "later", type: "t", key: "four", delayMs: 90250 },
    ]);
    const five = await enqueue(client, { queue: "later", type: "t", key: "five", delayMs: 1500 });
    const { rows } = await client.query(
      `SELECT id::text AS id, max_attempts, available_at, payload,
              extract(epoch FROM available_at - now())::float8 AS delay_s
       FROM pgoutbox.effects e WHERE queue = 'later' ORDER BY e.id`,
    );
    assert.deepEqual(rows.map((r) => r.id), [one, two, three, four, five]);
    assert.deepEqual(rows.map((r) => r.max_attempts), [2, 3, 8, 8, 8]);
    assert.equal(rows[0].available_at.toISOString(), at.toISOString());
    assert.equal(rows[1].available_at.toISOString(), at.toISOString());
    // On the database clock: now() is the transaction's start in both.
    assert.deepEqual(rows.slice(2).map((r) => r.delay_s), [0, 90.25, 1.5]);
    assert.deepEqual(rows.map((r) => r.payload), [{}, {}, null, {}, {}]);
    const err = await enqueue(client, { queue: "later", type: "t", key: "six", delayMs: 1, availableAt: at }).catch((e) => e);
    assert.equal(err.code, SQLState.InvalidEffect);
    assert.match(err.message, /delay cannot be combined with available_at/);
  } finally {
    await client.query("ROLLBACK");
    client.release();
  }
  assert.deepEqual(await counts(), before);
});

test("the active span's traceparent reaches the rows of both forms; a malformed one is refused", async () => {
  const api = await import("@opentelemetry/api");
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  const before = await counts();
  const client = await pool.connect();
  try {
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const span = api.trace.wrapSpanContext({ traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: 1 });
    await client.query("BEGIN");
    await api.context.with(api.trace.setSpan(api.context.active(), span), async () => {
      await enqueue(client, { queue: "traced", type: "t", key: "one" });
      await enqueueBatch(client, [
        { queue: "traced", type: "t", key: "two" },
        { queue: "traced", type: "t", key: "three", traceparent: null },
      ]);
    });
    await enqueue(client, { queue: "traced", type: "t", key: "four" }); // no active span
    const given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    await enqueue(client, { queue: "traced", type: "t", key: "five", traceparent: given });
    const { rows } = await client.query(`SELECT traceparent FROM pgoutbox.effects WHERE queue = 'traced' ORDER BY id`);
    assert.deepEqual(rows.map((r) => r.traceparent), [traceparent, traceparent, null, null, given]);
    const err = await enqueue(client, { queue: "traced", type: "t", key: "six", traceparent: traceparent.toUpperCase() }).catch((e) => e);
    assert.equal(err.code, SQLState.InvalidEffect);
    assert.match(err.message, /traceparent must be NULL \(none\) or a W3C traceparent of version 00/);
  } finally {
    await client.query("ROLLBACK");
    client.release();
    api.context.disable();
  }
  assert.deepEqual(await counts(), before);
});
