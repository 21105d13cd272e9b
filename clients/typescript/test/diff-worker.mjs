// The TypeScript side of test/anylang's differential test
// (TestWorkersLeaveEqualRows): a Worker whose handlers follow the script in
// $SCRIPT (per effect type: replaySafe and the outcome of each attempt) on
// $QUEUE until SIGTERM.
import pg from "pg";

import { Worker, retry, retryAfter, permanent, ambiguous } from "../dist/index.js";

const { DATABASE_URL: url, QUEUE: queue, SCRIPT: script } = process.env;
const pool = new pg.Pool({ connectionString: url, max: 6 });
const fail = {
  retry: () => retry(new Error("boom")),
  retry_after: () => retryAfter(1000, new Error("boom")),
  permanent: () => permanent(new Error("boom")),
  ambiguous: () => ambiguous(new Error("boom")),
  error: () => new Error("boom"),
};
const types = {};
for (const [name, s] of Object.entries(JSON.parse(script))) {
  types[name] = {
    replaySafe: s.replaySafe,
    handler: async (d) => {
      const o = s.outcomes[Math.min(d.attempt, s.outcomes.length) - 1];
      if (o !== "success") throw fail[o]();
    },
  };
}
const worker = new Worker(pool, { queue, types, concurrency: 4, pollMs: 100, recoverEveryMs: 500, backoffCapMs: 1000 });
await worker.start();
process.on("SIGTERM", async () => {
  await worker.stop();
  await pool.end();
  process.exit(0);
});
