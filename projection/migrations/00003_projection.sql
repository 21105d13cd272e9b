-- +goose Up
-- The record projection (docs/design.md, "The record projection"): the records that
-- POST /api/records and POST /api/import upsert, each change enqueuing a
-- record.upsert effect in the queue outbox_events in the same transaction.
CREATE SCHEMA IF NOT EXISTS storage_documents;

CREATE TABLE storage_documents.records (
    id           text PRIMARY KEY CHECK (id <> '' AND length(id) <= 512),
    -- The record as posted (a JSON object that carries "id").
    document     jsonb NOT NULL CHECK (jsonb_typeof(document) = 'object'),
    -- Hex SHA-256 of the canonical JSON of document: an identical re-post has
    -- the same hash and changes nothing.
    source_hash  text NOT NULL CHECK (length(source_hash) = 64),
    -- 1 on insert, +1 on every change of source_hash. Targets keep the
    -- version they projected, so an older projection never overwrites a newer
    -- one.
    version      bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    -- Full-text search over every string value of the document (the in-app
    -- discovery path, GET /api/records?q=).
    search       tsvector GENERATED ALWAYS AS (jsonb_to_tsvector('simple'::regconfig, document, '["string"]')) STORED,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX records_search_idx ON storage_documents.records USING gin (search);
CREATE INDEX records_updated_idx ON storage_documents.records (updated_at);

-- +goose Down
DROP TABLE storage_documents.records;
DROP SCHEMA storage_documents;
