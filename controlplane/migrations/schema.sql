-- The current schema control_plane, as the migrations leave it (pg_dump --schema-only --no-owner).
-- Generated: go test ./migrations -run TestSchemaFilesAreCurrent -update-schema. Do not edit;
-- change the schema with a new migration.
CREATE SCHEMA control_plane;

CREATE TABLE control_plane.execution_attempts (
    id bigint NOT NULL,
    release_run_id bigint NOT NULL,
    attempt_number integer NOT NULL,
    state text DEFAULT 'dispatching'::text NOT NULL,
    workflow_run_id bigint,
    conclusion text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    dispatched_at timestamp with time zone,
    completed_at timestamp with time zone,
    CONSTRAINT execution_attempts_attempt_number_check CHECK ((attempt_number >= 1)),
    CONSTRAINT execution_attempts_state_check CHECK ((state = ANY (ARRAY['dispatching'::text, 'dispatched'::text, 'completed'::text, 'superseded'::text])))
);

ALTER TABLE control_plane.execution_attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME control_plane.execution_attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE control_plane.installations (
    id bigint NOT NULL,
    account_login text DEFAULT ''::text NOT NULL,
    state text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT installations_state_check CHECK ((state = ANY (ARRAY['active'::text, 'suspended'::text, 'deleted'::text])))
);

CREATE TABLE control_plane.release_runs (
    id bigint NOT NULL,
    installation_id bigint NOT NULL,
    repository_id bigint NOT NULL,
    ref text NOT NULL,
    head_sha text NOT NULL,
    state text DEFAULT 'in_progress'::text NOT NULL,
    conclusion text,
    check_run_id bigint,
    source text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT release_runs_head_sha_check CHECK ((head_sha ~ '^[0-9a-f]{40}$'::text)),
    CONSTRAINT release_runs_source_check CHECK ((source = ANY (ARRAY['webhook'::text, 'api'::text]))),
    CONSTRAINT release_runs_state_check CHECK ((state = ANY (ARRAY['in_progress'::text, 'completed'::text])))
);

ALTER TABLE control_plane.release_runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME control_plane.release_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE control_plane.repositories (
    id bigint NOT NULL,
    installation_id bigint NOT NULL,
    full_name text NOT NULL,
    state text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT repositories_full_name_check CHECK ((full_name ~ '^[^/]+/[^/]+$'::text)),
    CONSTRAINT repositories_state_check CHECK ((state = ANY (ARRAY['active'::text, 'removed'::text])))
);

CREATE TABLE control_plane.webhook_inbox (
    id bigint NOT NULL,
    delivery_id text NOT NULL,
    event text NOT NULL,
    action text,
    installation_id bigint,
    repository_id bigint,
    body_sha256 text NOT NULL,
    normalized jsonb NOT NULL,
    status text DEFAULT 'received'::text NOT NULL,
    outcome text,
    received_at timestamp with time zone DEFAULT now() NOT NULL,
    processed_at timestamp with time zone,
    replay_of bigint,
    CONSTRAINT webhook_inbox_body_sha256_check CHECK ((body_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT webhook_inbox_delivery_id_check CHECK (((length(delivery_id) >= 1) AND (length(delivery_id) <= 128))),
    CONSTRAINT webhook_inbox_event_check CHECK (((length(event) >= 1) AND (length(event) <= 128))),
    CONSTRAINT webhook_inbox_normalized_check CHECK ((octet_length((normalized)::text) <= 65536)),
    CONSTRAINT webhook_inbox_status_check CHECK ((status = ANY (ARRAY['received'::text, 'applied'::text, 'ignored'::text])))
);

ALTER TABLE control_plane.webhook_inbox ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME control_plane.webhook_inbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

ALTER TABLE ONLY control_plane.execution_attempts
    ADD CONSTRAINT execution_attempts_pkey PRIMARY KEY (id);

ALTER TABLE ONLY control_plane.execution_attempts
    ADD CONSTRAINT execution_attempts_release_run_id_attempt_number_key UNIQUE (release_run_id, attempt_number);

ALTER TABLE ONLY control_plane.execution_attempts
    ADD CONSTRAINT execution_attempts_workflow_run_id_key UNIQUE (workflow_run_id);

ALTER TABLE ONLY control_plane.installations
    ADD CONSTRAINT installations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY control_plane.release_runs
    ADD CONSTRAINT release_runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY control_plane.release_runs
    ADD CONSTRAINT release_runs_repository_id_ref_head_sha_key UNIQUE (repository_id, ref, head_sha);

ALTER TABLE ONLY control_plane.repositories
    ADD CONSTRAINT repositories_pkey PRIMARY KEY (id);

ALTER TABLE ONLY control_plane.webhook_inbox
    ADD CONSTRAINT webhook_inbox_delivery_id_key UNIQUE (delivery_id);

ALTER TABLE ONLY control_plane.webhook_inbox
    ADD CONSTRAINT webhook_inbox_pkey PRIMARY KEY (id);

CREATE INDEX repositories_installation_idx ON control_plane.repositories USING btree (installation_id);

CREATE UNIQUE INDEX webhook_inbox_body_sha256_key ON control_plane.webhook_inbox USING btree (body_sha256) WHERE (replay_of IS NULL);

ALTER TABLE ONLY control_plane.execution_attempts
    ADD CONSTRAINT execution_attempts_release_run_id_fkey FOREIGN KEY (release_run_id) REFERENCES control_plane.release_runs(id);

ALTER TABLE ONLY control_plane.release_runs
    ADD CONSTRAINT release_runs_installation_id_fkey FOREIGN KEY (installation_id) REFERENCES control_plane.installations(id);

ALTER TABLE ONLY control_plane.release_runs
    ADD CONSTRAINT release_runs_repository_id_fkey FOREIGN KEY (repository_id) REFERENCES control_plane.repositories(id);

ALTER TABLE ONLY control_plane.repositories
    ADD CONSTRAINT repositories_installation_id_fkey FOREIGN KEY (installation_id) REFERENCES control_plane.installations(id);

ALTER TABLE ONLY control_plane.webhook_inbox
    ADD CONSTRAINT webhook_inbox_replay_of_fkey FOREIGN KEY (replay_of) REFERENCES control_plane.webhook_inbox(id);