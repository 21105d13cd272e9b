// Package projection is the record projection, pgoutbox's second
// application: records written to PostgreSQL (storage_documents.records) are
// projected to Solr and to a SPARQL 1.1 graph store (GraphDB by default)
// through the outbox queue "outbox_events".
//
// # Guarantees
//
//   - A record and its record.upsert effect commit together: POST
//     /api/records and every transaction of POST /api/import upsert the
//     records and enqueue their effects in the same transaction (the effect
//     exists if and only if the record change commits).
//   - Idempotent writes: a record's source hash is the SHA-256 of its
//     canonical JSON (keys sorted, whitespace removed, numbers as written).
//     Re-posting or re-importing an identical record changes nothing and
//     enqueues nothing; a changed record gets version+1 and one effect keyed
//     pgoutbox.Key("record.upsert", id, sourceHash). A record that returns to
//     content it had before, whose effect was already delivered, gets a
//     follow-up effect keyed Key("record.upsert", id, sourceHash, version).
//   - Bounded imports: JSON arrays, NDJSON and CSV are streamed; memory is
//     bounded by one transaction of rows (Config.ImportBatch) and the largest
//     row (Config.MaxRecordBytes), never by the body. A bad row is rejected
//     with its line number and reason; no partial row is stored. A body that
//     is unreadable as a whole stops the import with 4xx; rows of
//     transactions already committed stay, and re-posting resumes (they are
//     unchanged).
//   - Per-record order: record.upsert effects carry the record id as their
//     ordering key (pgoutbox.Effect.OrderingKey), so the engine delivers a
//     record's effects one at a time in commit order; a dead letter lets the
//     record's later versions through (EffectType.OrderingMovesOn). The
//     checks below stay as defence in depth.
//   - Out-of-order safety: deliveries of one record are serialized by a
//     transaction-scoped advisory lock, and each reads the record's current
//     state under that lock and projects it, so an older state is never sent
//     after a newer one. Solr documents also carry the record version
//     (pgoutbox_version_l) and are written with Solr's optimistic concurrency
//     (_version_), so an older version never replaces a newer one even if
//     two writers race outside the lock.
//   - Replay-safety: Solr adds replace by id; SPARQL updates are
//     DROP SILENT GRAPH <g> ; INSERT DATA { GRAPH <g> { … } } in one request
//     with one named graph per record. Replaying an effect leaves exactly one
//     document and one graph.
//   - Off by default: with no target enabled, EffectTypes and Queues are
//     empty, the projector and the cron endpoint claim nothing, and effects
//     wait (visible on /workers) until a target is turned on.
//   - No secrets in the database, logs, errors or pages: effect payloads
//     carry only the record id, version and source hash; bearer tokens are
//     compared as SHA-256 digests in constant time.
//
// # State names
//
// The projection's documentation used older state names; they map to the
// engine's states as: pending → available, processing → leased, retry →
// available with attempts > 0, processed → completed, dead_letter →
// dead_letter.
package projection
