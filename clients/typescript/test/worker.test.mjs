// The Worker against a real PostgreSQL (DATABASE_URL, pgoutbox's migrations
// applied, connecting as their owner): the suite creates a role in
// pgoutbox_worker, grants it its queues with pgoutbox.grant_work, and runs
// every worker under that role. Each test uses queues of its own. Waits are
// for progress (a row's state, a handler's call), never for a clock.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import pg from "pg";

import { Worker, retry, retryAfter, permanent, ambiguous, enqueue, enqueueBatch } from "../dist/index.js";

const url = process.env.DATABASE_URL;
const role = `pgoutbox_worker_ts_${randomBytes(4).toString("hex")}`;
let owner; // the migrations' owner: enqueues, grants, reads rows
let workerPool; // connections under role (set at connection start: a SET ROLE on "connect" raced the first query)

before(async () => {
  assert.ok(url, "DATABASE_URL must name a database with pgoutbox's migrations applied (test/anylang sets it)");
  owner = new pg.Pool({ connectionString: url, max: 4 });
  await owner.query(`CREATE ROLE ${role} NOLOGIN IN ROLE pgoutbox_worker`);
  workerPool = new pg.Pool({ connectionString: url, max: 8, options: `-c role=${role}` });
});

after(async () => {
  await workerPool?.end();
  if (owner) {
    await owner.query(`DELETE FROM pgoutbox.work_grants WHERE grantee = $1`, [role]);
    await owner.query(`DROP ROLE IF EXISTS ${role}`);
    await owner.end();
  }
});

let queues = 0;
// newQueue returns a queue of the test's own, granted to role.
async function newQueue() {
  const q = `ts-worker-${process.pid}-${++queues}`;
  await owner.query("SELECT pgoutbox.grant_work($1, $2)", [role, q]);
  return q;
}

async function put(queue, type, k, extra = {}) {
  const c = await owner.connect();
  try {
    await c.query("BEGIN");
    const id = await enqueue(c, { queue, type, key: k, payload: { k }, ...extra });
    await c.query("COMMIT");
    return id;
  } finally {
    c.release();
  }
}

async function row(id) {
  const { rows } = await owner.query(
    "SELECT state::text AS state, attempts, last_error, delivery_started_at, lease_expires_at FROM pgoutbox.effects WHERE id = $1",
    [id],
  );
  return rows[0];
}

// waitFor polls cond until it holds; the test's timeout bounds it.
async function waitFor(what, cond) {
  for (;;) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

function newWorker(queue, types, opts = {}) {
  const errors = [];
  const w = new Worker(workerPool, { queue, types, pollMs: 50, backoffCapMs: 1000, onError: (e) => errors.push(e), ...opts });
  w.errors = errors;
  return w;
}

// deferred is a promise with its resolve at hand.
function deferred() {
  let resolve;
  const p = new Promise((r) => (resolve = r));
  return { p, resolve };
}

// tally wraps inner (default: a turn of the event loop) in a handler that
// counts its calls per effect and the most that ran at once.
function tally(inner = () => new Promise((r) => setImmediate(r))) {
  const t = { seen: new Map(), running: 0, peak: 0 };
  t.handler = async (d) => {
    t.running++;
    t.peak = Math.max(t.peak, t.running);
    t.seen.set(d.id, (t.seen.get(d.id) ?? 0) + 1);
    try {
      await inner(d);
    } finally {
      t.running--;
    }
  };
  return t;
}

// completed counts the queue's completed effects, of either storage.
async function completed(q) {
  const { rows } = await owner.query("SELECT count(*)::int AS n FROM pgoutbox.effect_states WHERE queue = $1 AND state = 'completed'", [q]);
  return rows[0].n;
}

test("delivers every effect once, at most concurrency at a time", { timeout: 60_000 }, async () => {
  const q = await newQueue();
  const ids = [];
  for (let i = 0; i < 20; i++) ids.push(await put(q, "note", `k${i}`));
  const t = tally(async (d) => {
    assert.deepEqual(d.payload, { k: d.key });
    assert.equal(d.attempt, 1);
    await new Promise((r) => setImmediate(r));
  });
  const w = newWorker(q, { note: { replaySafe: true, handler: t.handler } }, { concurrency: 4 });
  await w.start();
  await waitFor("all completed", async () => (await completed(q)) === 20);
  await w.stop();
  assert.equal(t.seen.size, 20);
  for (const [id, n] of t.seen) assert.equal(n, 1, `effect ${id} delivered ${n} times`);
  assert.ok(t.peak <= 4, `${t.peak} handlers ran at once, concurrency 4`);
  assert.deepEqual(w.errors, []);
});

test("delivers a batch queue's replay-safe effects from the batch, writing no row for them", { timeout: 60_000 }, async () => {
  const q = await batchQueue();
  const ids = [];
  for (let i = 0; i < 30; i++) ids.push(await put(q, "note", `k${i}`, { orderingKey: i < 3 ? "o" : undefined }));
  const flaky = await put(q, "note", "flaky");
  const once = await put(q, "once", "x"); // not replay-safe: delivered through the row storage
  const seen = new Map();
  const w = newWorker(q, {
    note: {
      replaySafe: true,
      handler: async (d) => {
        seen.set(d.id, (seen.get(d.id) ?? 0) + 1);
        assert.deepEqual(d.payload, { k: d.key });
        if (d.key === "flaky" && d.attempt === 1) throw retry(new Error("503"));
      },
    },
    once: { handler: async (d) => { seen.set(d.id, (seen.get(d.id) ?? 0) + 1); } },
  }, { concurrency: 4 });
  await w.start();
  await waitFor("all completed", async () => (await completed(q)) === 32);
  await w.stop();
  for (const id of [...ids, once]) assert.equal(seen.get(id), 1, `effect ${id} delivered ${seen.get(id)} times`);
  assert.equal(seen.get(flaky), 2, "the failed effect is retried once");
  // Rows only for the exceptions: the retry, the type that is not
  // replay-safe, and the ordering key's later effects (moved behind its head).
  const { rows } = await owner.query("SELECT id::text AS id FROM pgoutbox.effects WHERE queue = $1 ORDER BY id", [q]);
  assert.deepEqual(rows.map((r) => r.id), [ids[1], ids[2], flaky, once]);
  const fr = await row(flaky);
  assert.equal(fr.attempts, 2);
  assert.ok((await row(once)).delivery_started_at, "the type that is not replay-safe was marked started");
  const { rows: settled } = await owner.query("SELECT coalesce(sum(completed), 0)::int AS n FROM pgoutbox.stream_settled WHERE queue = $1", [q]);
  assert.equal(settled[0].n, 28, "28 effects delivered from the batch");
  assert.deepEqual(w.errors, []);
});

// putMany enqueues effects (type, key) into queue in one transaction: one batch.
async function putMany(queue, effects) {
  const c = await owner.connect();
  try {
    await c.query("BEGIN");
    const ids = await enqueueBatch(c, effects.map(([type, key]) => ({ queue, type, key, payload: { k: key } })));
    await c.query("COMMIT");
    return ids;
  } finally {
    c.release();
  }
}

async function batchQueue() {
  const q = await newQueue();
  await owner.query("INSERT INTO pgoutbox.queue_storage (queue, storage) VALUES ($1, 'batch')", [q]);
  return q;
}

test("runs batch pages larger than its slots, concurrency - 1 handlers at once", { timeout: 60_000 }, async () => {
  const q = await batchQueue();
  const ids = await putMany(q, Array.from({ length: 300 }, (_, i) => ["note", `k${i}`]));
  const t = tally();
  const w = newWorker(q, { note: { replaySafe: true, handler: t.handler } }, { concurrency: 3 });
  await w.start();
  await waitFor("all completed", async () => (await completed(q)) === 300);
  await w.stop();
  for (const id of ids) assert.equal(t.seen.get(id), 1, `effect ${id} delivered ${t.seen.get(id)} times`);
  assert.ok(t.peak <= 2, `${t.peak} handlers of a page ran at once, concurrency 3 (one slot stays for the row claim)`);
  const { rows: moved } = await owner.query("SELECT count(*)::int AS n FROM pgoutbox.effects WHERE queue = $1", [q]);
  assert.equal(moved[0].n, 0, "no effect written to the row storage");
  // One stream_settled row per page: pages of the 2 slots would be 150.
  const { rows: pages } = await owner.query("SELECT count(*)::int AS n FROM pgoutbox.stream_settled WHERE queue = $1", [q]);
  assert.ok(pages[0].n < 30, `${pages[0].n} pages for 300 fast effects: the pages did not grow past the slots`);
  assert.deepEqual(w.errors, []);
});

test("promotes a page's slow handler at pageHoldMs and finishes it under a lease of its own", { timeout: 60_000 }, async () => {
  const q = await batchQueue();
  const [slow, ...fast] = await putMany(q, [["note", "slow"], ["note", "f1"], ["note", "f2"], ["note", "f3"]]);
  const gate = deferred();
  const started = deferred();
  const t = tally(async (d) => {
    if (d.key === "slow") {
      started.resolve();
      await gate.p;
    }
  });
  const w = newWorker(q, { note: { replaySafe: true, handler: t.handler } }, { concurrency: 5, pageHoldMs: 50 });
  await w.start();
  await started.p;
  // The page settled without it: its row is leased to the worker.
  await waitFor("the slow effect promoted", async () => (await row(slow))?.state === "leased");
  const { rows: owners } = await owner.query("SELECT lease_owner, attempts FROM pgoutbox.effects WHERE id = $1", [slow]);
  assert.equal(owners[0].lease_owner, w.id);
  assert.equal(owners[0].attempts, 1);
  for (const id of fast) {
    const { rows } = await owner.query("SELECT state::text AS state FROM pgoutbox.effect_states WHERE id = $1", [id]);
    assert.equal(rows[0].state, "completed", `fast effect ${id} settled from the batch while the slow one ran`);
    assert.equal(await row(id), undefined, `fast effect ${id} has no row`);
  }
  gate.resolve();
  await waitFor("the slow effect completed", async () => (await row(slow)).state === "completed");
  await w.stop();
  assert.equal((await row(slow)).attempts, 1);
  for (const id of [slow, ...fast]) assert.equal(t.seen.get(id), 1, `effect ${id} delivered ${t.seen.get(id)} times`);
  assert.deepEqual(w.errors, []);
});

test("promoted runs keep their slots: no more than concurrency handlers at once", { timeout: 60_000 }, async () => {
  const q = await batchQueue();
  const ids = await putMany(q, [["hang", "h0"], ["hang", "h1"], ["hang", "h2"], ["hang", "h3"]]);
  const gate = deferred();
  const t = tally(() => gate.p);
  const w = newWorker(q, { hang: { replaySafe: true, handler: t.handler } }, { concurrency: 3, pageHoldMs: 20 });
  await w.start();
  // Pages of the 2 slots, cut after 20 ms: their runs promoted to row
  // leases, which keep their slots; the third is the last free one.
  await waitFor("three effects promoted", async () => {
    const { rows } = await owner.query("SELECT count(*)::int AS n FROM pgoutbox.effects WHERE queue = $1 AND state = 'leased'", [q]);
    return rows[0].n >= 3;
  });
  assert.equal(t.running, 3, "handlers running once three were promoted, concurrency 3");
  gate.resolve();
  await waitFor("all completed", async () => (await completed(q)) === 4);
  await w.stop();
  assert.ok(t.peak <= 3, `${t.peak} handlers ran at once, concurrency 3`);
  for (const id of ids) assert.equal(t.seen.get(id), 1, `effect ${id} delivered ${t.seen.get(id)} times`);
  assert.deepEqual(w.errors, []);
});

test("stop cuts a batch page: what did not start goes back unrun, what runs is promoted and given back", { timeout: 60_000 }, async () => {
  const q = await batchQueue();
  const seen = new Map();
  const hanging = [deferred(), deferred()];
  const w = newWorker(q, {
    note: { replaySafe: true, handler: async (d) => { seen.set(d.id, (seen.get(d.id) ?? 0) + 1); } },
    hang: {
      replaySafe: true,
      handler: (d) => {
        seen.set(d.id, (seen.get(d.id) ?? 0) + 1);
        hanging[Number(d.key.slice(1))].resolve();
        return new Promise((_, rej) => d.signal.addEventListener("abort", () => rej(d.signal.reason)));
      },
    },
  }, { concurrency: 3, pageHoldMs: 600_000 });
  await w.start();
  // Fast handlers first, so that the next page grows past the 2 slots.
  const warm = await putMany(q, [["note", "w0"], ["note", "w1"], ["note", "w2"]]);
  await waitFor("the warm-up completed", async () => {
    const { rows } = await owner.query("SELECT count(*)::int AS n FROM pgoutbox.effect_states WHERE id = ANY($1) AND state = 'completed'", [warm]);
    return rows[0].n === 3;
  });
  const [h0, h1, a, b] = await putMany(q, [["hang", "h0"], ["hang", "h1"], ["note", "a"], ["note", "b"]]);
  await Promise.all(hanging.map((h) => h.p));
  await w.stop(10);
  for (const id of [h0, h1]) {
    const r = await row(id);
    assert.equal(r.state, "available", `running effect ${id} given back`);
    assert.equal(seen.get(id), 1);
  }
  for (const id of [a, b]) {
    const r = await row(id);
    assert.deepEqual([r.state, r.attempts], ["available", 0], `effect ${id}, not started, moved unrun`);
    assert.equal(seen.get(id), undefined, `effect ${id} was delivered by a stopping worker`);
  }
  assert.deepEqual(w.errors, []);
});

test("routes each outcome like the Go engine", { timeout: 60_000 }, async () => {
  const q = await newQueue();
  const perm = await put(q, "perm", "p");
  const amb = await put(q, "amb", "a");
  const plain = await put(q, "plain", "u"); // a plain error on a non-replay-safe type: ambiguous
  const safePlain = await put(q, "safeplain", "s", { maxAttempts: 2 }); // retried, then dead-lettered
  const later = await put(q, "later", "l");
  const unknown = await put(q, "nobody", "n", { maxAttempts: 1 });
  const w = newWorker(q, {
    perm: { replaySafe: true, handler: async () => { throw permanent(new Error("gone")); } },
    amb: { handler: async () => { throw ambiguous(new Error("timeout after send")); } },
    plain: { handler: async () => { throw new Error("reset"); } },
    safeplain: { replaySafe: true, handler: async () => { throw new Error("503"); } },
    later: { replaySafe: true, handler: async (d) => { if (d.attempt === 1) throw retryAfter(1000, new Error("429")); } },
  });
  await w.start();
  await waitFor("all settled", async () => {
    const states = await Promise.all([perm, amb, plain, safePlain, later, unknown].map(async (id) => (await row(id)).state));
    return !states.includes("available") && !states.includes("leased");
  });
  await w.stop();
  const r = async (id) => row(id);
  assert.equal((await r(perm)).state, "dead_letter");
  assert.match((await r(perm)).last_error, /^gone \(permanent\)$/);
  const a = await r(amb);
  assert.equal(a.state, "reconciliation_required");
  assert.ok(a.delivery_started_at, "a non-replay-safe delivery is marked started before its handler");
  assert.equal((await r(plain)).state, "reconciliation_required");
  const s = await r(safePlain);
  assert.equal(s.state, "dead_letter");
  assert.equal(s.attempts, 2);
  assert.equal(s.delivery_started_at, null, "a replay-safe delivery is not marked started");
  const l = await r(later);
  assert.equal(l.state, "completed");
  assert.equal(l.attempts, 2);
  const u = await r(unknown);
  assert.equal(u.state, "dead_letter");
  assert.match(u.last_error, /no handler registered for effect type "nobody"/);
  assert.deepEqual(w.errors, []);
});

test("extends the lease of a long delivery", { timeout: 60_000 }, async () => {
  const q = await newQueue();
  const id = await put(q, "slow", "k");
  const started = deferred();
  const release = deferred();
  const w = newWorker(q, {
    slow: { replaySafe: true, handler: async () => { started.resolve(); await release.p; } },
  }, { leaseMs: 1000, extendEveryMs: 100 });
  await w.start();
  await started.p;
  const first = (await row(id)).lease_expires_at;
  // Past the first lease's end the effect is still ours: extended, not expired.
  await waitFor("extended past the first lease", async () => {
    const { rows } = await owner.query("SELECT now() > $1::timestamptz AS past FROM pgoutbox.effects WHERE id = $2", [first, id]);
    return rows[0].past;
  });
  const r = await row(id);
  assert.equal(r.state, "leased");
  assert.ok(r.lease_expires_at > first, "the lease was pushed out");
  release.resolve();
  await waitFor("completed", async () => (await row(id)).state === "completed");
  await w.stop();
  assert.equal((await row(id)).attempts, 1);
});

test("wakes on NOTIFY without polling", { timeout: 30_000 }, async () => {
  const q = await newQueue();
  const got = deferred();
  const w = newWorker(q, { note: { replaySafe: true, handler: async (d) => got.resolve(d.key) } }, { pollMs: 3_600_000 });
  await w.start(); // its first claim finds nothing; only a notification wakes it within the hour
  await put(q, "note", "n1");
  assert.equal(await got.p, "n1");
  await w.stop();
});

test("stop finishes running deliveries, claims nothing more, and gives back what it cannot wait for", { timeout: 60_000 }, async () => {
  const q = await newQueue();
  const first = await put(q, "slow", "k1");
  const started = deferred();
  const release = deferred();
  const w = newWorker(q, {
    slow: { replaySafe: true, handler: async () => { started.resolve(); await release.p; } },
  }, { concurrency: 1 });
  await w.start();
  await started.p;
  const stopped = w.stop(60_000);
  const second = await put(q, "slow", "k2");
  release.resolve();
  await stopped;
  assert.equal((await row(first)).state, "completed");
  const s = await row(second);
  assert.equal(s.state, "available");
  assert.equal(s.attempts, 0, "a stopping worker claims nothing");

  // A handler that never returns: stop gives its effect back. A started
  // non-replay-safe delivery goes to reconciliation_required.
  const q2 = await newQueue();
  const safe = await put(q2, "hang", "h1");
  const unsafe = await put(q2, "hangunsafe", "h2");
  const both = [deferred(), deferred()];
  const w2 = newWorker(q2, {
    hang: { replaySafe: true, handler: (d) => { both[0].resolve(); return new Promise((_, rej) => d.signal.addEventListener("abort", () => rej(d.signal.reason))); } },
    hangunsafe: { handler: (d) => { both[1].resolve(); return new Promise((_, rej) => d.signal.addEventListener("abort", () => rej(d.signal.reason))); } },
  });
  await w2.start();
  await Promise.all(both.map((b) => b.p));
  await w2.stop(10);
  assert.equal((await row(safe)).state, "available");
  assert.equal((await row(unsafe)).state, "reconciliation_required");
  assert.deepEqual(w2.errors, []);
});

test("gives its LISTEN connection back to the pool without its listeners", { timeout: 60_000 }, async () => {
  const q = await newQueue();
  const pool = new pg.Pool({ connectionString: url, max: 2, options: `-c role=${role}` });
  try {
    // Two connections (a LISTEN and the claims), so the Workers' LISTENs
    // take the same ones again and again.
    for (let i = 0; i < 12; i++) {
      const w = new Worker(pool, { queue: q, types: {}, pollMs: 50, recoverEveryMs: 0, onError: (e) => assert.fail(e) });
      await w.start();
      await w.stop();
    }
    const cs = [await pool.connect(), await pool.connect()];
    try {
      for (const c of cs) {
        assert.equal(c.listenerCount("error"), 0, "error listeners left on a pooled connection");
        assert.equal(c.listenerCount("notification"), 0, "notification listeners left on a pooled connection");
      }
    } finally {
      for (const c of cs) c.release();
    }
  } finally {
    await pool.end();
  }
});

test("a queue not granted is refused (42501) and nothing changes", { timeout: 30_000 }, async () => {
  const q = `ts-worker-${process.pid}-closed`;
  const id = await put(q, "note", "k");
  const refused = deferred();
  const w = new Worker(workerPool, {
    queue: q,
    types: { note: { replaySafe: true, handler: async () => assert.fail("delivered from a queue not granted") } },
    pollMs: 50,
    onError: (e) => refused.resolve(e),
  });
  await w.start();
  const err = await refused.p;
  await w.stop();
  assert.equal(err.cause?.code, "42501");
  const r = await row(id);
  assert.equal(r.state, "available");
  assert.equal(r.attempts, 0);
});

test("bad settings are refused before anything runs", () => {
  assert.throws(() => new Worker(workerPool, { queue: "q", types: {}, concurrency: 0 }), RangeError);
  assert.throws(() => new Worker(workerPool, { queue: "q", types: {}, leaseMs: 10 }), RangeError);
  assert.throws(() => new Worker(workerPool, { queue: "q", types: { t: {} } }), TypeError);
  assert.throws(() => retryAfter(-1, new Error("x")), TypeError);
  assert.equal(retry(new Error("x")).outcome, "retry");
});
