-- +goose Up
-- Operations (docs/design.md, "Operations"): the shape of the aggregate samples
-- read by `readiness broker`, and the lease-recovery routing rule shared by
-- the sweeper and `requeue-stale`.

-- One row per worker process, queue and sample interval. Several processes
-- may sample the same queue at the same instant, so the worker is part of the
-- key; `readiness broker` adds their throughput and takes the worst latency.
ALTER TABLE pgoutbox.samples DROP CONSTRAINT samples_pkey;
ALTER TABLE pgoutbox.samples
    ADD COLUMN worker      text NOT NULL DEFAULT '' CHECK (length(worker) <= 256),
    ADD COLUMN interval_s  double precision NOT NULL DEFAULT 10 CHECK (interval_s > 0),
    ADD COLUMN claims      bigint NOT NULL DEFAULT 0 CHECK (claims >= 0),
    ADD COLUMN completions bigint NOT NULL DEFAULT 0 CHECK (completions >= 0),
    ADD COLUMN failures    bigint NOT NULL DEFAULT 0 CHECK (failures >= 0),
    ADD CONSTRAINT samples_pkey PRIMARY KEY (sampled_at, queue, worker);
COMMENT ON TABLE pgoutbox.samples IS
    'Aggregate worker samples (no payloads, no identifiers) read by `pgoutbox readiness broker`; pruned after 24 h by the sampler.';

-- Where an abandoned lease goes: a non-replay-safe effect whose delivery
-- started to reconciliation_required (never back to available), an
-- exhausted one to dead_letter, any other back to available.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.recovered_state(delivery_started_at timestamptz, attempts integer, max_attempts integer)
RETURNS pgoutbox.effect_state
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (CASE
        WHEN delivery_started_at IS NOT NULL THEN 'reconciliation_required'
        WHEN attempts >= max_attempts THEN 'dead_letter'
        ELSE 'available'
    END)::pgoutbox.effect_state
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgoutbox.recovered_state(timestamptz, integer, integer);
DELETE FROM pgoutbox.samples;
ALTER TABLE pgoutbox.samples DROP CONSTRAINT samples_pkey;
ALTER TABLE pgoutbox.samples
    DROP COLUMN worker, DROP COLUMN interval_s, DROP COLUMN claims,
    DROP COLUMN completions, DROP COLUMN failures,
    ADD CONSTRAINT samples_pkey PRIMARY KEY (sampled_at, queue);
