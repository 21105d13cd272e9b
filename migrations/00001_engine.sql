-- +goose Up
-- The engine: one table for every queue's effects (see docs/design.md, "Queues").
CREATE SCHEMA IF NOT EXISTS pgoutbox;

CREATE TYPE pgoutbox.effect_state AS ENUM (
    'available', 'leased', 'completed', 'dead_letter', 'reconciliation_required'
);

CREATE TABLE pgoutbox.effects (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue                text NOT NULL CHECK (queue <> '' AND length(queue) <= 128),
    effect_type          text NOT NULL CHECK (effect_type <> '' AND length(effect_type) <= 128),
    idempotency_key      text NOT NULL CHECK (idempotency_key <> '' AND length(idempotency_key) <= 512),
    payload              jsonb NOT NULL DEFAULT '{}'::jsonb
                         CONSTRAINT effects_payload_size CHECK (octet_length(payload::text) <= 65536),
    state                pgoutbox.effect_state NOT NULL DEFAULT 'available',
    attempts             integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts         integer NOT NULL DEFAULT 8 CHECK (max_attempts BETWEEN 1 AND 1000),
    available_at         timestamptz NOT NULL DEFAULT now(),
    created_at           timestamptz NOT NULL DEFAULT now(),
    leased_at            timestamptz,
    lease_owner          text,
    lease_token          uuid,
    lease_expires_at     timestamptz,
    delivery_started_at  timestamptz,
    completed_at         timestamptz,
    dead_lettered_at     timestamptz,
    reconciliation_at    timestamptz,
    last_error           text,
    resolution           jsonb,
    CONSTRAINT effects_queue_key UNIQUE (queue, idempotency_key),
    CONSTRAINT effects_lease_consistent CHECK (
        (state = 'leased') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);

-- Claims: the head of each queue's available rows, in (available_at, id) order.
CREATE INDEX effects_claim_idx ON pgoutbox.effects (queue, available_at, id)
    WHERE state = 'available';
-- The sweeper: leases by expiry.
CREATE INDEX effects_lease_expiry_idx ON pgoutbox.effects (lease_expires_at)
    WHERE state = 'leased';
-- Retention pruning of completed rows.
CREATE INDEX effects_completed_idx ON pgoutbox.effects (completed_at)
    WHERE state = 'completed';
-- Operator listings: dead letters and reconciliation records (never pruned).
CREATE INDEX effects_attention_idx ON pgoutbox.effects (queue, state, id)
    WHERE state IN ('dead_letter', 'reconciliation_required');

-- One NOTIFY per transaction and queue: PostgreSQL folds identical notifications
-- raised in one transaction, so a statement-level trigger is enough even for
-- effects inserted by plain SQL.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        PERFORM pg_notify('pgoutbox_effects', q);
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_notify_insert
    AFTER INSERT ON pgoutbox.effects
    REFERENCING NEW TABLE AS new_effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.notify_effects();

-- Aggregate samples written by workers and read by `readiness broker`.
CREATE TABLE pgoutbox.samples (
    sampled_at              timestamptz NOT NULL DEFAULT now(),
    queue                   text NOT NULL,
    claim_latency_p99_ms    double precision,
    oldest_available_age_s  double precision,
    completed_per_second    double precision,
    workers_healthy         boolean NOT NULL DEFAULT true,
    PRIMARY KEY (sampled_at, queue)
);

-- +goose Down
DROP TABLE pgoutbox.samples;
DROP TABLE pgoutbox.effects;
DROP FUNCTION pgoutbox.notify_effects();
DROP TYPE pgoutbox.effect_state;
DROP SCHEMA pgoutbox;
