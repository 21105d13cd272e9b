package projection

// Every SQL statement of the projection lives in this file. Statements that
// read the engine's table (pgoutbox.effects) only read it; every write to it
// goes through the root package (Enqueue, leases).

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

// existingKeysSQL returns the idempotency keys that already name an effect
// that is no longer waiting in the queue (a record reverted to content it
// had before: the effect for that content was already delivered or is in
// flight, so a follow-up effect is needed).
const existingKeysSQL = `
SELECT k.idempotency_key FROM pgoutbox.effect_keys k
JOIN pgoutbox.effects e ON e.id = k.effect_id
WHERE k.queue = $1 AND k.idempotency_key = ANY($2::text[]) AND e.state <> 'available'`

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

// remainingSQL counts the projection queue's effects that still have to be
// delivered (available, including retries waiting for their backoff, and
// leased).
const remainingSQL = `
SELECT count(*) FILTER (WHERE state = 'available'),
       count(*) FILTER (WHERE state = 'available' AND available_at <= now()),
       count(*) FILTER (WHERE state = 'leased')
FROM pgoutbox.effects WHERE queue = $1 AND state IN ('available', 'leased')`

// queueStatsSQL is the backlog of every queue by state, for /workers.
const queueStatsSQL = `
SELECT queue, state::text, count(*),
       count(*) FILTER (WHERE state = 'available' AND attempts > 0),
       coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE state = 'available' AND available_at <= now())), 0)::float8
FROM pgoutbox.effects
GROUP BY queue, state
ORDER BY queue, state`

// throughputSQL is, per queue, what completed in the last $1 seconds and its
// mean lag (creation to completion).
const throughputSQL = `
SELECT queue, count(*), coalesce(avg(extract(epoch FROM completed_at - created_at)), 0)::float8
FROM pgoutbox.effects
WHERE state = 'completed' AND completed_at > now() - make_interval(secs => $1)
GROUP BY queue`

// attentionSQL lists dead letters and reconciliation records with their last
// errors (never payloads), newest first.
const attentionSQL = `
SELECT id, queue, effect_type, state::text, attempts, coalesce(last_error, ''),
       coalesce(dead_lettered_at, reconciliation_at, available_at)
FROM pgoutbox.effects
WHERE state IN ('dead_letter', 'reconciliation_required')
ORDER BY coalesce(dead_lettered_at, reconciliation_at) DESC NULLS LAST, id DESC
LIMIT $1`

// projectionLagSQL is the age of the oldest record.upsert still waiting to be
// projected (0 when the projection is caught up).
const projectionLagSQL = `
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM pgoutbox.effects
WHERE queue = $1 AND state IN ('available', 'leased')`
