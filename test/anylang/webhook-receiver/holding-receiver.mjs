// A Node endpoint for TestWorkKilledMidHTTPDelivery: like receiver.mjs it
// verifies each request with the Standard Webhooks reference library
// (standardwebhooks on npm), but it never answers the first verified
// request of a webhook-id: it holds it open, so that the test can kill the
// `pgoutbox work` process in the middle of the delivery. Later requests of
// that webhook-id are answered 204, one that does not verify 401.
//
// It prints "listening <port>" and then one JSON line per request as it
// arrives: {"id", "verified", "held", "type", "attempt"}. On SIGTERM it
// drops the connections still open and exits, so every line is out.
import http from "node:http";
import { Webhook } from "standardwebhooks";

const wh = new Webhook(process.env.WEBHOOK_SECRET);
const seen = new Set();

const server = http.createServer((req, res) => {
  const chunks = [];
  let size = 0;
  req.on("data", (c) => {
    size += c.length;
    if (size > 1 << 20) {
      res.writeHead(413).end();
      req.destroy();
      return;
    }
    chunks.push(c);
  });
  req.on("end", () => {
    const id = req.headers["webhook-id"] ?? null;
    const attempt = req.headers["pgoutbox-attempt"] ?? null;
    let event;
    try {
      event = wh.verify(Buffer.concat(chunks).toString("utf8"), req.headers);
    } catch (err) {
      console.log(JSON.stringify({ id, verified: false, held: false, attempt, error: String(err.message) }));
      res.writeHead(401).end();
      return;
    }
    const held = !seen.has(id);
    seen.add(id);
    console.log(JSON.stringify({ id, verified: true, held, type: event.type, attempt }));
    if (!held) {
      res.writeHead(204).end();
    }
  });
});

server.listen(0, "127.0.0.1", () => console.log(`listening ${server.address().port}`));
process.on("SIGTERM", () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
});
