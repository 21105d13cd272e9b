-- +goose Up
-- `status` of a batch partially settled and not leased reads at most a
-- chunk of its rows (docs/batch-storage.md "Seen by status"). Migration
-- 00030 counts a batch's pending effects per type (type_effects less
-- type_passed), but the earliest available_at of what is left after a
-- partial settle was not known, so store.Stats read every unsettled row of
-- such a batch: a consumer's lease that expired mid-batch, and, the norm,
-- a batch drained by SQL or TypeScript batch workers (settle_page releases
-- the lease after each page) or by pgoutbox.claim (stream_to_rows) — at
-- 200,000 pending effects in one batch, every status read them all.
--
--   * stream_tick records, per effect type of the new batch, the earliest
--     available_at of each chunk of 1,024 ids that holds its effects
--     (chunk_types, chunk_ends: the chunk's last id, chunk_available_at),
--     from the scan that counts them anyway.
--   * store.Stats takes such a batch's counts from type_effects less
--     type_passed, its earliest available_at per type from the chunks past
--     its settled position, and reads only the rest of the chunk that holds
--     the settled position.
--
-- A batch ticked before this migration has NULL chunk arrays and is read
-- as before.
ALTER TABLE pgoutbox.stream_batches
    ADD COLUMN chunk_types text[],
    ADD COLUMN chunk_ends bigint[],
    ADD COLUMN chunk_available_at timestamptz[];
COMMENT ON COLUMN pgoutbox.stream_batches.chunk_types IS
    'Per effect type and chunk of 1,024 ids of the batch (NULL: ticked before migration 00035): the type; chunk_ends holds the chunk''s last id, chunk_available_at its earliest available_at.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_lanes integer;
    v_n     bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    SELECT coalesce((SELECT q.lanes FROM pgoutbox.queue_storage q WHERE q.queue = p_queue), 1) INTO v_lanes;
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    -- Lane l holds the slots s with s * lanes / 256 = l: from
    -- ceil(256 l / lanes) to ceil(256 (l + 1) / lanes) - 1.
    -- Each (lane, type) also gets its earliest available_at per chunk of
    -- 1,024 ids (chunk_*), for status of a batch partially settled.
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through,
        type_names, type_effects, type_available_at, type_passed, slot_lo, slot_hi,
        chunk_types, chunk_ends, chunk_available_at)
    WITH c AS (
        -- The chunk first: the rows come about in id order, which the
        -- grouping's sort then finds nearly done.
        SELECT s.id >> 10 AS chunk, s.slot * v_lanes / 256 AS lane, s.effect_type, min(s.id) AS lo, max(s.id) AS hi,
            count(*) AS n, min(s.available_at) AS avail
        FROM pgoutbox.stream_after(p_queue, v_prev) s
        WHERE pg_visible_in_snapshot(s.xid, v_snap)
        GROUP BY 1, 2, 3
    )
    SELECT p_queue, coalesce(v_last, 0) + row_number() OVER (ORDER BY l.lane), v_snap, v_prev, l.lo, l.hi, l.n,
        l.lo - 1, l.names, l.counts, l.avail, array_fill(0::bigint, ARRAY[cardinality(l.names)]),
        ((256 * l.lane + v_lanes - 1) / v_lanes)::smallint, ((256 * (l.lane + 1) + v_lanes - 1) / v_lanes - 1)::smallint,
        k.types, k.ends, k.avail
    FROM (
        SELECT t.lane, min(t.lo) AS lo, max(t.hi) AS hi, sum(t.n)::bigint AS n, array_agg(t.effect_type ORDER BY t.effect_type)
            AS names, array_agg(t.n ORDER BY t.effect_type) AS counts, array_agg(t.avail ORDER BY t.effect_type) AS avail
        FROM (
            SELECT c.lane, c.effect_type, min(c.lo) AS lo, max(c.hi) AS hi, sum(c.n)::bigint AS n, min(c.avail) AS avail
            FROM c
            GROUP BY 1, 2
        ) t
        GROUP BY t.lane
    ) l
    JOIN (
        SELECT c.lane, array_agg(c.effect_type ORDER BY c.effect_type, c.chunk) AS types,
            array_agg((c.chunk << 10) + 1023 ORDER BY c.effect_type, c.chunk) AS ends,
            array_agg(c.avail ORDER BY c.effect_type, c.chunk) AS avail
        FROM c
        GROUP BY c.lane
    ) k ON k.lane = l.lane;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(v_last, 0) + 1;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_lanes integer;
    v_n     bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    SELECT coalesce((SELECT q.lanes FROM pgoutbox.queue_storage q WHERE q.queue = p_queue), 1) INTO v_lanes;
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    -- Lane l holds the slots s with s * lanes / 256 = l: from
    -- ceil(256 l / lanes) to ceil(256 (l + 1) / lanes) - 1.
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through,
        type_names, type_effects, type_available_at, type_passed, slot_lo, slot_hi)
    SELECT p_queue, coalesce(v_last, 0) + row_number() OVER (ORDER BY l.lane), v_snap, v_prev, l.lo, l.hi, l.n,
        l.lo - 1, l.names, l.counts, l.avail, array_fill(0::bigint, ARRAY[cardinality(l.names)]),
        ((256 * l.lane + v_lanes - 1) / v_lanes)::smallint, ((256 * (l.lane + 1) + v_lanes - 1) / v_lanes - 1)::smallint
    FROM (
        SELECT t.lane, min(t.lo) AS lo, max(t.hi) AS hi, sum(t.n) AS n, array_agg(t.effect_type ORDER BY t.effect_type)
            AS names, array_agg(t.n ORDER BY t.effect_type) AS counts, array_agg(t.avail ORDER BY t.effect_type) AS avail
        FROM (
            SELECT s.slot * v_lanes / 256 AS lane, s.effect_type, min(s.id) AS lo, max(s.id) AS hi, count(*) AS n,
                min(s.available_at) AS avail
            FROM pgoutbox.stream_after(p_queue, v_prev) s
            WHERE pg_visible_in_snapshot(s.xid, v_snap)
            GROUP BY 1, 2
        ) t
        GROUP BY t.lane
    ) l;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(v_last, 0) + 1;
END;
$$;
-- +goose StatementEnd

ALTER TABLE pgoutbox.stream_batches
    DROP COLUMN chunk_types,
    DROP COLUMN chunk_ends,
    DROP COLUMN chunk_available_at;
