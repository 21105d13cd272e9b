// A MetaMuseum-shaped Next.js route handler (app/api/records/route.ts):
// POST a record, and the record's upsert and its record.upsert effect commit
// in one transaction. `pgoutbox work` (with the projection application and
// a target on, e.g. OUTBOX_PROJECT_TO_SOLR=1) delivers the effect: it reads
// the record's current state and projects it (docs/projection.md).
//
// The database role of the app needs INSERT/UPDATE on
// storage_documents.records, membership in pgoutbox_enqueuer and the owner's
// grant of the projection's queue and type, nothing on the engine's tables:
//   GRANT pgoutbox_enqueuer TO metamuseum_app;
//   SELECT pgoutbox.grant_enqueue('metamuseum_app', 'outbox_events', 'record.upsert');
import { createHash } from "node:crypto";

import pg from "pg";
import { enqueue, isRefusal, key } from "@pgoutbox/client";

// One pool per server instance; on Vercel, point DATABASE_URL at a pooler
// in transaction mode (a transaction stays on one connection).
const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 5 });

// The projection's queue and effect type (projection.Queue, projection.EffectType).
const QUEUE = "outbox_events";
const EFFECT_TYPE = "record.upsert";

// Inserts the record, or updates it when its content changed (version + 1);
// an identical re-post returns no row and enqueues nothing.
const UPSERT = `
INSERT INTO storage_documents.records AS r (id, document, source_hash)
VALUES ($1, $2::jsonb, $3)
ON CONFLICT (id) DO UPDATE
    SET document = excluded.document, source_hash = excluded.source_hash,
        version = r.version + 1, updated_at = now()
    WHERE r.source_hash IS DISTINCT FROM excluded.source_hash
RETURNING r.version::text AS version, (xmax = 0) AS inserted`;

// canonical is the document with its keys sorted and no white space: its
// hash says whether the content changed. (Numbers are JavaScript's rendering,
// so the same document may hash differently here and in Go's importer; the
// hash only decides "changed or not", so that is harmless.)
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(",")}}`;
  }
  return JSON.stringify(v);
}

export async function POST(req: Request): Promise<Response> {
  let doc: unknown;
  try {
    doc = await req.json();
  } catch {
    return Response.json({ error: "the body is not JSON" }, { status: 400 });
  }
  if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
    return Response.json({ error: "a record is a JSON object" }, { status: 400 });
  }
  const id = (doc as { id?: unknown }).id;
  if (typeof id !== "string" || id === "" || Buffer.byteLength(id) > 512) {
    return Response.json({ error: "a record needs an id: a string of 1-512 bytes" }, { status: 400 });
  }
  const text = canonical(doc);
  const hash = createHash("sha256").update(text, "utf8").digest("hex");

  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const { rows } = await client.query<{ version: string; inserted: boolean }>(UPSERT, [id, text, hash]);
    const row = rows[0];
    if (row === undefined) {
      await client.query("COMMIT");
      return Response.json({ id, status: "unchanged" });
    }
    // One effect per version: a record that returns to earlier content gets
    // a new effect too (the projection reads the current state, so an extra
    // delivery is harmless; a missing one would leave the target stale).
    const effectId = await enqueue(client, {
      queue: QUEUE,
      type: EFFECT_TYPE,
      key: key(EFFECT_TYPE, id, hash, row.version),
      payload: { record_id: id, version: Number(row.version), source_hash: hash },
    });
    await client.query("COMMIT");
    return Response.json(
      { id, status: row.inserted ? "created" : "updated", version: Number(row.version), effect_id: effectId },
      { status: row.inserted ? 201 : 200 },
    );
  } catch (err) {
    await client.query("ROLLBACK");
    if (isRefusal(err)) {
      // The SQL API refused the effect (OB001-OB003): nothing was written.
      return Response.json({ error: err.message, code: err.code }, { status: 422 });
    }
    throw err;
  } finally {
    client.release();
  }
}
