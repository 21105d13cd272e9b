-- +goose Up
-- Per-key order across a switch from batch storage back to rows
-- (docs/batch-storage.md "Switching storage"; issue 32). After a queue's
-- storage goes back to rows, an effect enqueued then is written to
-- pgoutbox.effects while earlier effects of its ordering key may still wait
-- in pgoutbox.stream, delivered by the batch loop (or moved into rows by
-- pgoutbox.claim) beside the row claim: the row claim could take the later
-- one first (a probe: third, first, second in 2 of 3 runs).
--
--   * A trigger marks a queue whose storage leaves batch
--     (queue_storage.left_batch_at); pgoutbox.clear_left_batch, run by
--     Client.Prune, clears the mark once its stream holds none of its
--     effects unsettled.
--   * The claim (store.claimSQL, hence pgoutbox.work_claim_rows and
--     pgoutbox.claim; the row-lock claim too) takes an ordered effect of a
--     marked queue only while its id is below every stream effect of the
--     queue that is not settled: each open batch's rows above its settled
--     position, and the rows committed after its newest batch
--     (pgoutbox.stream_floor). The bound is computed once per claim, only
--     when an ordered effect is a candidate (an InitPlan): for a queue
--     that is not marked, one probe of queue_storage.
--   * A queue whose storage is batch is not gated: its pages move a key's
--     stream effects behind the ones pgoutbox.effects holds.
--
-- The enqueue's ordering lock makes this enough: an effect of a key is
-- inserted only after every transaction that enqueued to the key ended, so
-- a later effect in rows is never visible to a claim that does not see the
-- earlier one in the stream.

-- When a queue's storage went from batch to rows (any writer: SetStorage,
-- a Client recording its configuration, an UPDATE by hand): the claim
-- reads the queue's stream only for a queue that has one.
ALTER TABLE pgoutbox.queue_storage ADD COLUMN left_batch_at timestamptz;
COMMENT ON COLUMN pgoutbox.queue_storage.left_batch_at IS
    'When the storage went from batch to rows: the claim holds the ordered effects of the queue behind its stream''s unsettled ones (pgoutbox.stream_floor) until this is cleared.';
UPDATE pgoutbox.queue_storage q SET left_batch_at = now()
WHERE q.storage = 'rows' AND EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.queue = q.queue);

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.queue_storage_left_batch() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NEW.storage = 'batch' THEN
        NEW.left_batch_at := NULL;
    ELSIF OLD.storage = 'batch' THEN
        NEW.left_batch_at := now();
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER queue_storage_left_batch BEFORE UPDATE OF storage ON pgoutbox.queue_storage
    FOR EACH ROW WHEN (OLD.storage IS DISTINCT FROM NEW.storage) EXECUTE FUNCTION pgoutbox.queue_storage_left_batch();

-- The lowest id of a stream effect of p_queue that is not settled (NULL
-- when there is none): each open batch's rows above its settled position
-- (done_through), and the rows committed after the queue's newest batch
-- (not ticked yet: what stream_after reads). Its callers ask it only for
-- a marked queue (left_batch_at). STABLE: it reads with the claim's
-- snapshot. It runs with its caller's privileges.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_floor(p_queue text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_open bigint;
    v_snap pg_snapshot;
    v_new  bigint;
BEGIN
    SELECT min(b.done_through) + 1 INTO v_open
    FROM pgoutbox.stream_batches b WHERE b.queue = p_queue AND b.done_at IS NULL;
    SELECT b.snap INTO v_snap FROM pgoutbox.stream_batches b WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT min(s.id) INTO v_new FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND (s.xid >= coalesce(pg_snapshot_xmax(v_snap), '1'::xid8)
                                 OR s.xid = ANY (ARRAY(SELECT pg_snapshot_xip(v_snap))));
    RETURN least(v_open, v_new);
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION pgoutbox.stream_floor(text) FROM PUBLIC;

-- Clears left_batch_at of each queue whose stream holds none of its
-- effects unsettled (stream_floor is NULL: its batches are settled and
-- nothing was committed after the newest), once no transaction that holds
-- an ordering lock is open: a producer that read the queue's storage as
-- batch before the switch took its key's ordering lock before that read
-- and holds it until it commits, so no ordered effect of the queue can
-- reach the stream after this. It
-- waits at most lock_timeout 100 ms for those locks (then clears nothing,
-- and the next call tries again); what it takes blocks ordered enqueues
-- for that long at most. Returns how many queues it cleared. Run by
-- Client.Prune (store.ClearLeftBatch), under READ COMMITTED, so that its
-- UPDATE reads what those transactions committed.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.clear_left_batch() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_queues text[];
    v_n      integer := 0;
    v_saved  text := current_setting('lock_timeout');
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: clear_left_batch must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT array_agg(q.queue) INTO v_queues FROM pgoutbox.queue_storage q
    WHERE q.left_batch_at IS NOT NULL AND q.storage = 'rows'
      AND pgoutbox.stream_floor(q.queue) IS NULL;
    IF v_queues IS NULL THEN
        RETURN 0;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM count(*) FROM (SELECT 1 FROM pgoutbox.ordering_stripes s ORDER BY s.stripe FOR SHARE) l;
        UPDATE pgoutbox.queue_storage q SET left_batch_at = NULL
        WHERE q.queue = ANY (v_queues) AND q.left_batch_at IS NOT NULL AND q.storage = 'rows'
          AND pgoutbox.stream_floor(q.queue) IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    EXCEPTION WHEN lock_not_available THEN
        NULL; -- an enqueue holds an ordering lock: the next call tries again
    END;
    PERFORM set_config('lock_timeout', v_saved, true);
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION pgoutbox.clear_left_batch() FROM PUBLIC;

-- store.claimSQL, verbatim.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.work_claim_rows(text, integer, text, float8, integer)
RETURNS TABLE (r_id bigint, r_queue text, r_effect_type text, r_key text, r_payload jsonb, r_attempts integer,
               r_max_attempts integer, r_token uuid, r_created_at timestamptz, r_latency float8,
               r_delivery_started_at timestamptz, r_ordering_key text, r_traceparent text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH next AS (SELECT id 
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
      AND (e.ordering_key IS NULL OR (e.id < coalesce((
        SELECT pgoutbox.stream_floor(qs.queue) FROM pgoutbox.queue_storage qs
        WHERE qs.queue = $1 AND qs.storage = 'rows' AND qs.left_batch_at IS NOT NULL), 9223372036854775807) AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id < e.id
          AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
          AND (p.state <> 'dead_letter' OR NOT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p.effect_type),
        false))) AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id > e.id
          AND p.ordering_key IS NOT NULL AND p.state = 'leased') AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.replay_barriers w
        JOIN pgoutbox.stream_batches b ON b.queue = w.queue AND b.id = w.batch_id
        WHERE w.effect_id = e.id AND b.done_at IS NULL AND b.done_through = w.done_through
          AND b.lease_token = w.lease_token AND b.lease_expires_at >= now())))
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
SET state = 'leased', attempts = e.attempts + $5::int, lease_owner = $3,
    lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = statement_timestamp() + make_interval(secs => $4)
WHERE e.id = ANY(ARRAY(SELECT id FROM next))
RETURNING e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts,
    e.lease_token, e.created_at, extract(epoch FROM now() - e.available_at)::float8, e.delivery_started_at,
    coalesce(e.ordering_key, ''), coalesce(e.traceparent, '')
$fn$;
-- +goose StatementEnd

-- +goose Down
-- 00029's claim, verbatim.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.work_claim_rows(text, integer, text, float8, integer)
RETURNS TABLE (r_id bigint, r_queue text, r_effect_type text, r_key text, r_payload jsonb, r_attempts integer,
               r_max_attempts integer, r_token uuid, r_created_at timestamptz, r_latency float8,
               r_delivery_started_at timestamptz, r_ordering_key text, r_traceparent text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH next AS (SELECT id 
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
      AND (e.ordering_key IS NULL OR (NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id < e.id
          AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
          AND (p.state <> 'dead_letter' OR NOT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p.effect_type),
        false))) AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id > e.id
          AND p.ordering_key IS NOT NULL AND p.state = 'leased') AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.replay_barriers w
        JOIN pgoutbox.stream_batches b ON b.queue = w.queue AND b.id = w.batch_id
        WHERE w.effect_id = e.id AND b.done_at IS NULL AND b.done_through = w.done_through
          AND b.lease_token = w.lease_token AND b.lease_expires_at >= now())))
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
SET state = 'leased', attempts = e.attempts + $5::int, lease_owner = $3,
    lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = statement_timestamp() + make_interval(secs => $4)
WHERE e.id = ANY(ARRAY(SELECT id FROM next))
RETURNING e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts,
    e.lease_token, e.created_at, extract(epoch FROM now() - e.available_at)::float8, e.delivery_started_at,
    coalesce(e.ordering_key, ''), coalesce(e.traceparent, '')
$fn$;
-- +goose StatementEnd

DROP FUNCTION pgoutbox.clear_left_batch();
DROP FUNCTION pgoutbox.stream_floor(text);
DROP TRIGGER queue_storage_left_batch ON pgoutbox.queue_storage;
DROP FUNCTION pgoutbox.queue_storage_left_batch();
ALTER TABLE pgoutbox.queue_storage DROP COLUMN left_batch_at;
