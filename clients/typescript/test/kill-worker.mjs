// A worker process for test/anylang's kill test (TestTypeScriptWorkerKilled).
// It works the queue $QUEUE of $DATABASE_URL with a 1-second lease; each
// handler first records its delivery in the table kill_deliveries and prints
// "delivering <id>". With MODE=hang the handlers never return (the test kills
// the process mid-delivery); with MODE=finish they succeed. SIGTERM stops
// the worker gracefully.
import pg from "pg";

import { Worker } from "../dist/index.js";

const { DATABASE_URL: url, QUEUE: queue, MODE: mode } = process.env;
const pool = new pg.Pool({ connectionString: url, max: 6 });

async function handler(d) {
  await pool.query("INSERT INTO kill_deliveries (effect_id, mode) VALUES ($1, $2)", [d.id, mode]);
  process.stdout.write(`delivering ${d.id}\n`);
  if (mode === "hang") await new Promise(() => {});
}

const worker = new Worker(pool, {
  queue,
  concurrency: 2,
  leaseMs: 1000,
  extendEveryMs: 200,
  pollMs: 100,
  recoverEveryMs: 100,
  // The killed page is still the batch's when the process dies: no cut
  // promotes its hanging handler to a row lease first.
  pageHoldMs: 600_000,
  types: {
    "charge.create": { replaySafe: false, handler },
    "record.upsert": { replaySafe: true, handler },
  },
});
await worker.start();
process.stdout.write("started\n");
process.on("SIGTERM", async () => {
  await worker.stop();
  await pool.end();
  process.exit(0);
});
