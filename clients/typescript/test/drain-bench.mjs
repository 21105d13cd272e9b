// A benchmark, not a test: how fast one Worker drains a backlog of no-op
// effects of a replay-safe type on a row storage queue and on a batch
// storage queue (docs/benchmarks.md, "Workers in any language"). It runs as
// the migrations' owner on $DATABASE_URL (pgoutbox's migrations applied),
// ROUNDS rounds (default 3) of N effects (default 20,000) per storage with
// CONCURRENCY handlers (default 10, the Worker's), alternating, each on a
// queue of its own, and prints effects/s per round: from the Worker's start
// to the end of its stop after its handlers' n-th call (stop writes the
// last outcomes, and must leave every effect completed).
// Run: npm run build && DATABASE_URL=... node test/drain-bench.mjs
import pg from "pg";

import { Worker, enqueueBatch } from "../dist/index.js";

const url = process.env.DATABASE_URL;
const n = Number(process.env.N ?? 20_000);
const rounds = Number(process.env.ROUNDS ?? 3);
const concurrency = Number(process.env.CONCURRENCY ?? 10);
const pool = new pg.Pool({ connectionString: url, max: 12 });
const pad = "x".repeat(300);
const stamp = Date.now();

async function drain(storage, round) {
  const queue = `ts-drain-${stamp}-${storage}-${round}`;
  await pool.query("INSERT INTO pgoutbox.queue_storage (queue, storage) VALUES ($1, $2)", [queue, storage]);
  for (let start = 0; start < n; start += 1000) {
    const c = await pool.connect();
    try {
      await c.query("BEGIN");
      const effects = [];
      for (let i = start; i < Math.min(start + 1000, n); i++) {
        effects.push({ queue, type: "noop", key: `k${i}`, payload: { pad } });
      }
      await enqueueBatch(c, effects);
      await c.query("COMMIT");
    } finally {
      c.release();
    }
  }
  let delivered = 0;
  let done;
  const all = new Promise((r) => (done = r));
  const w = new Worker(pool, {
    queue,
    concurrency,
    pollMs: 20,
    recoverEveryMs: 0,
    types: {
      noop: {
        replaySafe: true,
        handler: async () => {
          if (++delivered === n) done();
        },
      },
    },
  });
  const t0 = performance.now();
  await w.start();
  await all;
  await w.stop();
  const secs = (performance.now() - t0) / 1000;
  const { rows } = await pool.query(
    "SELECT count(*)::int AS n FROM pgoutbox.effect_states WHERE queue = $1 AND state = 'completed'",
    [queue],
  );
  if (rows[0].n !== n) throw new Error(`${storage}: ${rows[0].n} of ${n} effects completed after stop`);
  return n / secs;
}

const results = { rows: [], batch: [] };
for (let r = 0; r < rounds; r++) {
  for (const storage of ["rows", "batch"]) {
    const rate = await drain(storage, r);
    results[storage].push(Math.round(rate));
    console.log(`round ${r + 1} ${storage}: ${Math.round(rate)} effects/s`);
  }
}
for (const [storage, rates] of Object.entries(results)) {
  const sorted = [...rates].sort((a, b) => a - b);
  console.log(`${storage}: median ${sorted[Math.floor(sorted.length / 2)]} effects/s [${sorted[0]} – ${sorted[sorted.length - 1]}]`);
}
await pool.end();
