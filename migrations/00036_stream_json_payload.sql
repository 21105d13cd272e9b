-- +goose Up
-- A batch page returns each payload as the producer wrote it
-- (docs/batch-storage.md, "A payload is kept as its producer wrote it").
-- pgoutbox.stream stored it as jsonb, so every page read spelled each
-- payload out again (jsonb's output, 1.6 µs for 300 bytes: a third of the
-- page read, measured in docs/benchmarks.md); it is now json, the text as
-- given, checked to be JSON when written, and a page read copies it.
--
--   * The size bound is unchanged: the payload's text as jsonb writes it
--     (effects_payload_size) is at most 65,536 bytes, so that a stream
--     effect moved to pgoutbox.effects (a retry, a held key, PageHold,
--     pgoutbox.claim) always fits there.
--   * pgoutbox.effect_states and pgoutbox.claim_batch keep returning jsonb.
--   * Rewrites the stream's rows (a backlog of batch storage effects)
--     under an ACCESS EXCLUSIVE lock.
DROP VIEW pgoutbox.effect_states;
ALTER TABLE pgoutbox.stream DROP CONSTRAINT stream_payload_size;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload DROP DEFAULT;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload TYPE json USING payload::json;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload SET DEFAULT '{}'::json;
ALTER TABLE pgoutbox.stream ADD CONSTRAINT stream_payload_size CHECK (octet_length(payload::jsonb::text) <= 65536);
COMMENT ON COLUMN pgoutbox.stream.payload IS
    'The payload as the producer wrote it (json, migration 00036); its jsonb text is at most 65,536 bytes.';

CREATE VIEW pgoutbox.effect_states AS
SELECT e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.state, e.attempts, e.max_attempts,
    e.available_at, e.created_at, e.lease_token, e.lease_expires_at, e.delivery_started_at, e.completed_at,
    e.last_error, e.ordering_key, 'rows'::text AS storage
FROM pgoutbox.effects e
UNION ALL
SELECT s.id, s.queue, s.effect_type, s.idempotency_key, s.payload::jsonb, st.state,
    CASE WHEN st.state = 'available' THEN 0 ELSE 1 END, s.max_attempts, s.available_at, s.created_at,
    CASE WHEN st.state = 'leased' THEN b.lease_token END, CASE WHEN st.state = 'leased' THEN b.lease_expires_at END,
    NULL::timestamptz, CASE WHEN st.state = 'completed' THEN b.done_at END, NULL::text, s.ordering_key,
    'batch'::text
FROM pgoutbox.stream s
LEFT JOIN LATERAL (
    SELECT b.* FROM pgoutbox.stream_batches b
    WHERE b.queue = s.queue AND s.slot BETWEEN b.slot_lo AND b.slot_hi AND pg_visible_in_snapshot(s.xid, b.snap)
      AND (b.done_at IS NOT NULL OR b.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, b.prev_snap))
    ORDER BY b.id LIMIT 1
) b ON true
CROSS JOIN LATERAL (
    SELECT (CASE
        WHEN b.done_at IS NOT NULL OR b.done_through >= s.id THEN 'completed'
        WHEN b.lease_token IS NOT NULL AND b.lease_expires_at > now() THEN 'leased'
        ELSE 'available'
    END)::pgoutbox.effect_state AS state
) st
LEFT JOIN LATERAL (SELECT true AS moved FROM pgoutbox.effects m WHERE m.id = s.id LIMIT 1) mv ON true
WHERE mv.moved IS NULL;
COMMENT ON VIEW pgoutbox.effect_states IS 'Every effect in either storage with its state (docs/batch-storage.md).';

-- claim_batch (migrations 00032, 00033) returns the payload as jsonb, as
-- before: its definition is created again with that one cast added.
-- +goose StatementBegin
DO $do$
DECLARE
    v_def text := pg_catalog.pg_get_functiondef('pgoutbox.claim_batch(text, text, text[], integer, interval)'::regprocedure);
    v_new text;
BEGIN
    v_new := pg_catalog.replace(v_def, 'p.idempotency_key, p.payload, 1,', 'p.idempotency_key, p.payload::jsonb, 1,');
    IF v_new = v_def THEN
        RAISE EXCEPTION 'pgoutbox 00036: claim_batch has no payload column to change';
    END IF;
    EXECUTE v_new;
END;
$do$;
-- +goose StatementEnd

-- +goose Down
DROP VIEW pgoutbox.effect_states;
ALTER TABLE pgoutbox.stream DROP CONSTRAINT stream_payload_size;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload DROP DEFAULT;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload TYPE jsonb USING payload::jsonb;
ALTER TABLE pgoutbox.stream ALTER COLUMN payload SET DEFAULT '{}'::jsonb;
ALTER TABLE pgoutbox.stream ADD CONSTRAINT stream_payload_size CHECK (octet_length(payload::text) <= 65536);
COMMENT ON COLUMN pgoutbox.stream.payload IS NULL;

CREATE VIEW pgoutbox.effect_states AS
SELECT e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.state, e.attempts, e.max_attempts,
    e.available_at, e.created_at, e.lease_token, e.lease_expires_at, e.delivery_started_at, e.completed_at,
    e.last_error, e.ordering_key, 'rows'::text AS storage
FROM pgoutbox.effects e
UNION ALL
SELECT s.id, s.queue, s.effect_type, s.idempotency_key, s.payload, st.state,
    CASE WHEN st.state = 'available' THEN 0 ELSE 1 END, s.max_attempts, s.available_at, s.created_at,
    CASE WHEN st.state = 'leased' THEN b.lease_token END, CASE WHEN st.state = 'leased' THEN b.lease_expires_at END,
    NULL::timestamptz, CASE WHEN st.state = 'completed' THEN b.done_at END, NULL::text, s.ordering_key,
    'batch'::text
FROM pgoutbox.stream s
LEFT JOIN LATERAL (
    SELECT b.* FROM pgoutbox.stream_batches b
    WHERE b.queue = s.queue AND s.slot BETWEEN b.slot_lo AND b.slot_hi AND pg_visible_in_snapshot(s.xid, b.snap)
      AND (b.done_at IS NOT NULL OR b.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, b.prev_snap))
    ORDER BY b.id LIMIT 1
) b ON true
CROSS JOIN LATERAL (
    SELECT (CASE
        WHEN b.done_at IS NOT NULL OR b.done_through >= s.id THEN 'completed'
        WHEN b.lease_token IS NOT NULL AND b.lease_expires_at > now() THEN 'leased'
        ELSE 'available'
    END)::pgoutbox.effect_state AS state
) st
LEFT JOIN LATERAL (SELECT true AS moved FROM pgoutbox.effects m WHERE m.id = s.id LIMIT 1) mv ON true
WHERE mv.moved IS NULL;
COMMENT ON VIEW pgoutbox.effect_states IS 'Every effect in either storage with its state (docs/batch-storage.md).';

-- +goose StatementBegin
DO $do$
DECLARE
    v_def text := pg_catalog.pg_get_functiondef('pgoutbox.claim_batch(text, text, text[], integer, interval)'::regprocedure);
    v_new text;
BEGIN
    v_new := pg_catalog.replace(v_def, 'p.idempotency_key, p.payload::jsonb, 1,', 'p.idempotency_key, p.payload, 1,');
    IF v_new = v_def THEN
        RAISE EXCEPTION 'pgoutbox 00036: claim_batch has no payload cast to change';
    END IF;
    EXECUTE v_new;
END;
$do$;
-- +goose StatementEnd
