// A Node service with no Go code: it marks an order paid and enqueues the
// receipt email in one transaction, and delivers the email itself as a
// Worker. Run it: DATABASE_URL=... node examples/worker-service.mjs 4711
// (its role needs pgoutbox_enqueuer and pgoutbox_worker, granted the queue
// "emails" with pgoutbox.grant_enqueue and pgoutbox.grant_work). SIGTERM or
// SIGINT stops it gracefully.
import pg from "pg";
import { enqueue, key, permanent, Worker } from "@pgoutbox/client";

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
await pool.query(`CREATE TABLE IF NOT EXISTS orders (
  id integer PRIMARY KEY, state text NOT NULL, receipt_sent_at timestamptz)`);

// The state change and its effect commit together, or neither does.
async function markPaid(orderId) {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await client.query(
      "INSERT INTO orders (id, state) VALUES ($1, 'paid') ON CONFLICT (id) DO UPDATE SET state = 'paid'",
      [orderId],
    );
    await enqueue(client, {
      queue: "emails",
      type: "email.receipt",
      key: key("email.receipt", String(orderId)),
      payload: { order_id: orderId },
    });
    await client.query("COMMIT");
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  } finally {
    client.release();
  }
}

// The handler: here it records the receipt; a real one calls a mail API
// with d.key as its idempotency key, and passes d.signal to abort the call
// when the lease is lost.
async function sendReceipt(d) {
  const { order_id: orderId } = d.payload;
  if (!Number.isInteger(orderId)) throw permanent(new Error("payload has no order_id"));
  await pool.query("UPDATE orders SET receipt_sent_at = now() WHERE id = $1", [orderId]);
  console.log(`sent the receipt of order ${orderId} (effect ${d.id}, attempt ${d.attempt})`);
}

const worker = new Worker(pool, {
  queue: "emails",
  types: { "email.receipt": { replaySafe: true, handler: sendReceipt } },
});
await worker.start();
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, async () => {
    await worker.stop();
    await pool.end();
  });
}
for (const arg of process.argv.slice(2)) await markPaid(Number(arg));
