-- The current schema storage_documents, as the migrations leave it (pg_dump --schema-only --no-owner).
-- Generated: go test ./migrations -run TestSchemaFilesAreCurrent -update-schema. Do not edit;
-- change the schema with a new migration.
CREATE SCHEMA storage_documents;

CREATE TABLE storage_documents.records (
    id text NOT NULL,
    document jsonb NOT NULL,
    source_hash text NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    search tsvector GENERATED ALWAYS AS (jsonb_to_tsvector('simple'::regconfig, document, '["string"]'::jsonb)) STORED,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT records_document_check CHECK ((jsonb_typeof(document) = 'object'::text)),
    CONSTRAINT records_id_check CHECK (((id <> ''::text) AND (length(id) <= 512))),
    CONSTRAINT records_source_hash_check CHECK ((length(source_hash) = 64)),
    CONSTRAINT records_version_check CHECK ((version >= 1))
);

ALTER TABLE ONLY storage_documents.records
    ADD CONSTRAINT records_pkey PRIMARY KEY (id);

CREATE INDEX records_search_idx ON storage_documents.records USING gin (search);

CREATE INDEX records_updated_idx ON storage_documents.records USING btree (updated_at);