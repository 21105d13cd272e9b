-- +goose Up
-- The release control plane (docs/design.md, "The release control plane").
CREATE SCHEMA IF NOT EXISTS control_plane;

-- Every accepted webhook delivery: the normalized, bounded event and the
-- SHA-256 of the raw body, never the raw body.
CREATE TABLE control_plane.webhook_inbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    delivery_id      text NOT NULL UNIQUE CHECK (length(delivery_id) BETWEEN 1 AND 128),
    event            text NOT NULL CHECK (length(event) BETWEEN 1 AND 128),
    action           text,
    installation_id  bigint,
    repository_id    bigint,
    body_sha256      text NOT NULL CHECK (body_sha256 ~ '^[0-9a-f]{64}$'),
    normalized       jsonb NOT NULL CHECK (octet_length(normalized::text) <= 65536),
    status           text NOT NULL DEFAULT 'received'
                     CHECK (status IN ('received', 'applied', 'ignored')),
    outcome          text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    processed_at     timestamptz
);

CREATE TABLE control_plane.installations (
    id             bigint PRIMARY KEY,
    account_login  text NOT NULL DEFAULT '',
    state          text NOT NULL CHECK (state IN ('active', 'suspended', 'deleted')),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE control_plane.repositories (
    id               bigint PRIMARY KEY,
    installation_id  bigint NOT NULL REFERENCES control_plane.installations (id),
    full_name        text NOT NULL CHECK (full_name ~ '^[^/]+/[^/]+$'),
    state            text NOT NULL CHECK (state IN ('active', 'removed')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX repositories_installation_idx ON control_plane.repositories (installation_id);

CREATE TABLE control_plane.release_runs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    installation_id  bigint NOT NULL REFERENCES control_plane.installations (id),
    repository_id    bigint NOT NULL REFERENCES control_plane.repositories (id),
    ref              text NOT NULL,
    head_sha         text NOT NULL CHECK (head_sha ~ '^[0-9a-f]{40}$'),
    state            text NOT NULL DEFAULT 'in_progress' CHECK (state IN ('in_progress', 'completed')),
    conclusion       text,
    check_run_id     bigint,
    source           text NOT NULL CHECK (source IN ('webhook', 'api')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (repository_id, ref, head_sha)
);

CREATE TABLE control_plane.execution_attempts (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    release_run_id    bigint NOT NULL REFERENCES control_plane.release_runs (id),
    attempt_number    integer NOT NULL CHECK (attempt_number >= 1),
    state             text NOT NULL DEFAULT 'dispatching'
                      CHECK (state IN ('dispatching', 'dispatched', 'completed', 'superseded')),
    workflow_run_id   bigint UNIQUE,
    conclusion        text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    dispatched_at     timestamptz,
    completed_at      timestamptz,
    UNIQUE (release_run_id, attempt_number)
);

-- Replays dead letters of control_plane_outbox; reconciliation records are
-- never touched (an operator resolves them with `pgoutbox reconcile`).
-- +goose StatementBegin
CREATE FUNCTION boardreadyops_replay_control_plane_outbox(max_rows integer DEFAULT 100)
RETURNS integer
LANGUAGE sql AS $$
    WITH picked AS (
        SELECT id FROM pgoutbox.effects
        WHERE queue = 'control_plane_outbox' AND state = 'dead_letter'
        ORDER BY id
        LIMIT greatest(max_rows, 0)
        FOR UPDATE SKIP LOCKED
    ), replayed AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(), dead_lettered_at = NULL,
            delivery_started_at = NULL
        FROM picked WHERE e.id = picked.id AND e.state = 'dead_letter'
        RETURNING e.id
    )
    SELECT count(*)::integer FROM replayed
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION boardreadyops_replay_control_plane_outbox(integer);
DROP TABLE control_plane.execution_attempts;
DROP TABLE control_plane.release_runs;
DROP TABLE control_plane.repositories;
DROP TABLE control_plane.installations;
DROP TABLE control_plane.webhook_inbox;
DROP SCHEMA control_plane;
