// A Node service with no Go code that receives pgoutbox's HTTP deliveries
// and verifies each with the Standard Webhooks reference library
// (standardwebhooks on npm), as docs/any-language.md shows. test/anylang
// starts it with WEBHOOK_SECRET set; it prints "listening <port>" and then
// one JSON line per request: {"id", "verified", "type", "data"}. A request
// that does not verify is answered 401 (a permanent failure at pgoutbox),
// a verified one 204.
import http from "node:http";
import { Webhook } from "standardwebhooks";

const wh = new Webhook(process.env.WEBHOOK_SECRET);

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
    const body = Buffer.concat(chunks).toString("utf8");
    let event = null;
    try {
      event = wh.verify(body, req.headers);
    } catch (err) {
      console.log(JSON.stringify({ id: req.headers["webhook-id"] ?? null, verified: false, error: String(err.message) }));
      res.writeHead(401).end();
      return;
    }
    console.log(JSON.stringify({ id: req.headers["webhook-id"], verified: true, type: event.type, data: event.data }));
    res.writeHead(204).end();
  });
});

server.listen(0, "127.0.0.1", () => console.log(`listening ${server.address().port}`));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
