package projection

// Every SQL statement of the projection's own schema (storage_documents)
// lives in this file. The projection never names the engine's tables: it
// reads them through internal/store (key look-up, backlog, /workers) and
// writes them through the root package (Enqueue, leases).

// upsertSQL writes a batch of records (ids unique within the batch) and
// returns the rows that were inserted or changed; a record whose source hash
// is unchanged is not touched and not returned.
const upsertSQL = `
INSERT INTO storage_documents.records AS r (id, document, source_hash)
SELECT id, document, source_hash
FROM unnest($1::text[], $2::jsonb[], $3::text[]) AS t(id, document, source_hash)
ON CONFLICT (id) DO UPDATE
    SET document = excluded.document, source_hash = excluded.source_hash,
        version = r.version + 1, updated_at = now()
    WHERE r.source_hash IS DISTINCT FROM excluded.source_hash
RETURNING r.id, r.version, r.source_hash, (xmax = 0) AS inserted`

// getRecordSQL reads one record.
const getRecordSQL = `
SELECT id, document, source_hash, version, created_at, updated_at
FROM storage_documents.records WHERE id = $1`

// searchRecordsSQL is the in-app discovery path: full-text search over every
// string value, best match first.
const searchRecordsSQL = `
SELECT id, document, source_hash, version, created_at, updated_at
FROM storage_documents.records
WHERE search @@ websearch_to_tsquery('simple', $1)
ORDER BY ts_rank(search, websearch_to_tsquery('simple', $1)) DESC, id
LIMIT $2`

// listRecordsSQL pages through records by id (keyset pagination).
const listRecordsSQL = `
SELECT id, document, source_hash, version, created_at, updated_at
FROM storage_documents.records
WHERE id > $1
ORDER BY id
LIMIT $2`

// countRecordsSQL is the record count (readiness).
const countRecordsSQL = `SELECT count(*) FROM storage_documents.records`

// lockRecordSQL serializes the projections of one record (every target, every
// worker): deliveries of the same record run one after the other, and each
// reads the record's current state under the lock. The lock is released when
// the delivery's transaction ends.
const lockRecordSQL = `SELECT pg_advisory_xact_lock(hashtextextended('pgoutbox.projection:' || $1, 0))`
