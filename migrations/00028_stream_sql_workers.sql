-- +goose Up
-- Batch storage for the SQL API's callers (docs/batch-storage.md, issue 32).
--
-- 1. The enqueue functions no longer trust pgoutbox.routed. The engine's
--    own statements set it to say they routed a batch queue's rows
--    themselves, and the trigger effects_to_stream (00027) then stays out
--    of their way; a role that may only enqueue could set it too, keeping
--    its effects of a batch queue out of the stream (an ordered one could
--    then run before an earlier effect of its key). enqueue_rows, which
--    enqueue and enqueue_batch call, now clears it, and the stream's notify
--    marker, before it writes.
-- 2. pgoutbox.claim delivers batch queues: before it claims rows it moves
--    the next page of the queue's oldest open batch, as many effects as it
--    may claim, into pgoutbox.effects as available rows (stream_to_rows),
--    unless a consumer holds that batch's lease. They are then claimed,
--    delivered, retried and dead-lettered by the row code, as the Go
--    Client's exceptions are; the SQL and TypeScript workers write a row
--    per effect, as in row storage, and keep every guarantee.
-- 3. A batch's page is read by stream_page, whose plan walks the id index
--    in order and stops at the page's end. The stream's partitions are
--    seldom analyzed (they are filled and truncated, never vacuumed), and
--    with their statistics unknown the planner read every remaining row of
--    the batch for each page and sorted them: a 50,000-effect batch cost
--    33 us per effect in its page reads (20.7 ms a page, 1.8 ms now), and
--    a batch of N effects N^2/2000 row reads.
-- 4. The stream's maintenance functions of 00027 (stream_tick,
--    stream_maintain) run as their owner and were left executable by
--    PUBLIC: a role that may only enqueue could rotate the stream (an
--    exclusive lock that stalls every batch queue's writers for up to
--    200 ms a call) and truncate settled generations early, or close
--    batches of any queue. Only the owner (the Clients) calls them now;
--    the page and range readers likewise.
-- 5. pgoutbox.stream_settled: each settled page's count of effects
--    completed from the batch, per type, with their lag's median and 99th
--    percentile, so that `status` counts a batch queue's completions.

-- One row per settled page and effect type of a batch queue: how many of
-- its effects were delivered from the batch (they have no row of their
-- own), and their lag (creation to the settle) in seconds. Written by the
-- settle, pruned after CompletedRetention by Client.Prune.
CREATE TABLE pgoutbox.stream_settled (
    queue       text NOT NULL,
    effect_type text NOT NULL,
    settled_at  timestamptz NOT NULL DEFAULT now(),
    completed   bigint NOT NULL CHECK (completed > 0),
    lag_p50     float8 NOT NULL,
    lag_p99     float8 NOT NULL
);
CREATE INDEX stream_settled_at_idx ON pgoutbox.stream_settled (settled_at);
COMMENT ON TABLE pgoutbox.stream_settled IS
    'Completions of batch-storage effects per settled page and type, for status (docs/batch-storage.md).';

ALTER FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[],
    text[]) RENAME TO enqueue_rows_routed;

-- +goose StatementBegin
-- enqueue_rows (00024) with the routing markers cleared first: its INSERT
-- into pgoutbox.effects always goes through effects_to_stream.
CREATE FUNCTION pgoutbox.enqueue_rows(
    p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[],
    p_available_at timestamptz[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('pgoutbox.routed', 'off', true), set_config('pgoutbox.stream_notified', '', true);
    RETURN pgoutbox.enqueue_rows_routed(p_queues, p_types, p_keys, p_payloads, p_max_attempts, p_available_at,
        p_delays, p_ordering_keys, p_traceparents);
END;
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[],
    text[], text[]) FROM PUBLIC;

-- +goose StatementBegin
-- stream_page is the next page of a batch: the rows of p_queue after
-- p_after, through p_max_id, committed in p_snap and not in p_prev (the
-- previous batch's snapshot; NULL: none), in id order, at most p_limit.
-- Its settings leave the planner one plan whatever the statistics say:
-- each partition's id index, read in order, merged, stopped at p_limit.
-- The rows of other queues between the batch's ids are read and skipped;
-- a batch's ids span what every queue enqueued while it was open.
CREATE FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot,
    p_prev pg_snapshot, p_limit integer) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    SET enable_bitmapscan = off
    SET enable_seqscan = off
    SET enable_sort = off
    AS $$
    SELECT s.* FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND s.id > p_after AND s.id <= p_max_id
      AND pg_visible_in_snapshot(s.xid, p_snap)
      AND (p_prev IS NULL OR NOT pg_visible_in_snapshot(s.xid, p_prev))
    ORDER BY s.id
    LIMIT p_limit
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- stream_to_rows moves up to p_max effects of p_queue's oldest open batch
-- (and the next ones, once it is exhausted) into pgoutbox.effects as
-- available rows (attempts 0, their key rows exist already) and advances
-- the batch's settled position past them, closing the batch after its
-- last. It ticks first (under READ
-- COMMITTED; the tick needs fresh snapshots), and moves nothing when the
-- queue is paused, has no open batch, or a consumer holds the oldest
-- one's lease, or another transaction is moving it (the batch row is
-- locked, SKIP LOCKED: only the oldest open batch is ever taken, so one
-- key's effects keep their order). An expired lease is taken over: its
-- holder may have delivered the page, and its effects, replay-safe, are
-- delivered again from the rows. Returns how many effects it moved.
CREATE FUNCTION pgoutbox.stream_to_rows(p_queue text, p_max integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    b       pgoutbox.stream_batches;
    v_n     integer;
    v_last  bigint;
    v_moved integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = p_queue AND s.storage = 'batch')
       AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = p_queue AND x.done_at IS NULL) THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = p_queue) THEN
        RETURN 0;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgoutbox.stream_tick(p_queue);
    END IF;
    -- Batch after batch, oldest first, until p_max effects moved.
    WHILE v_moved < p_max LOOP
        SELECT x.* INTO b FROM pgoutbox.stream_batches x
        WHERE x.queue = p_queue AND x.done_at IS NULL
          AND x.id = (SELECT min(y.id) FROM pgoutbox.stream_batches y WHERE y.queue = p_queue AND y.done_at IS NULL)
          AND (x.lease_token IS NULL OR x.lease_expires_at < now())
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            EXIT;
        END IF;
        WITH page AS (
            SELECT * FROM pgoutbox.stream_page(p_queue, b.done_through, b.max_id, b.snap, b.prev_snap, p_max - v_moved)
        ), marked AS (
            SELECT set_config('pgoutbox.keys_written', 'on', true) AS m, set_config('pgoutbox.routed', 'on', true) AS r
        ), moved AS (
            INSERT INTO pgoutbox.effects (id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
                created_at, ordering_key, traceparent)
            OVERRIDING SYSTEM VALUE
            SELECT p.id, p.queue, p.effect_type, p.idempotency_key, p.payload, p.max_attempts, p.available_at,
                p.created_at, p.ordering_key, p.traceparent
            FROM page p CROSS JOIN marked
            ORDER BY p.id
            RETURNING id
        )
        SELECT count(*), max(m.id) INTO v_n, v_last FROM moved m;
        IF v_n = 0 THEN
            -- effect_keys_insert did not fire: clear the markers here.
            PERFORM set_config('pgoutbox.keys_written', 'off', true), set_config('pgoutbox.routed', 'off', true);
        END IF;
        v_moved := v_moved + v_n;
        IF v_moved < p_max OR v_last = b.max_id THEN
            -- The batch's last page: it is done.
            UPDATE pgoutbox.stream_batches x
            SET done_through = x.max_id, done_at = now(), lease_token = NULL, lease_owner = NULL,
                lease_expires_at = NULL
            WHERE x.queue = p_queue AND x.id = b.id;
        ELSE
            UPDATE pgoutbox.stream_batches x
            SET done_through = v_last, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
            WHERE x.queue = p_queue AND x.id = b.id;
        END IF;
    END LOOP;
    RETURN v_moved;
END;
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.stream_to_rows(text, integer) FROM PUBLIC;

-- +goose StatementBegin
-- claim (00025), which first moves the next page of a batch queue into
-- rows (stream_to_rows).
CREATE OR REPLACE FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer DEFAULT 1,
                                          lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (id bigint, effect_type text, idempotency_key text, payload jsonb, attempt integer,
               max_attempts integer, lease_token uuid, created_at timestamptz,
               delivery_started_at timestamptz, ordering_key text, traceparent text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), claim.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(claim.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(claim.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    PERFORM pgoutbox.work_refuse_bound(claim.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    PERFORM pgoutbox.stream_to_rows(claim.queue, claim.max_effects);
    RETURN QUERY
    SELECT c.r_id, c.r_effect_type, c.r_key, c.r_payload, c.r_attempts, c.r_max_attempts, c.r_token,
        c.r_created_at, c.r_delivery_started_at, nullif(c.r_ordering_key, ''), nullif(c.r_traceparent, '')
    FROM pgoutbox.work_claim_rows(claim.queue, claim.max_effects, claim.worker,
        extract(epoch FROM claim.lease)::float8, 1) c;
END;
$$;
-- +goose StatementEnd

REVOKE ALL ON FUNCTION pgoutbox.stream_tick(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgoutbox.stream_maintain(interval, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgoutbox.stream_after(text, pg_snapshot) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgoutbox.stream_page(text, bigint, bigint, pg_snapshot, pg_snapshot, integer) FROM PUBLIC;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer DEFAULT 1,
                                          lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (id bigint, effect_type text, idempotency_key text, payload jsonb, attempt integer,
               max_attempts integer, lease_token uuid, created_at timestamptz,
               delivery_started_at timestamptz, ordering_key text, traceparent text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), claim.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(claim.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(claim.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    PERFORM pgoutbox.work_refuse_bound(claim.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    RETURN QUERY
    SELECT c.r_id, c.r_effect_type, c.r_key, c.r_payload, c.r_attempts, c.r_max_attempts, c.r_token,
        c.r_created_at, c.r_delivery_started_at, nullif(c.r_ordering_key, ''), nullif(c.r_traceparent, '')
    FROM pgoutbox.work_claim_rows(claim.queue, claim.max_effects, claim.worker,
        extract(epoch FROM claim.lease)::float8, 1) c;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION pgoutbox.stream_to_rows(text, integer);
DROP FUNCTION pgoutbox.stream_page(text, bigint, bigint, pg_snapshot, pg_snapshot, integer);
DROP FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[],
    text[]);
ALTER FUNCTION pgoutbox.enqueue_rows_routed(text[], text[], text[], json[], integer[], timestamptz[], interval[],
    text[], text[]) RENAME TO enqueue_rows;
DROP TABLE pgoutbox.stream_settled;
GRANT EXECUTE ON FUNCTION pgoutbox.stream_tick(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgoutbox.stream_maintain(interval, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION pgoutbox.stream_after(text, pg_snapshot) TO PUBLIC;
