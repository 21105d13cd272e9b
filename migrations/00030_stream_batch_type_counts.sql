-- +goose Up
-- `status` reads a batch queue's pending effects per batch, not per row
-- (docs/batch-storage.md "Seen by status"). store.Stats read them through
-- pgoutbox.stream_pending, every pending stream row: ~4 µs a row, ~40 s a
-- status at 10M pending, every 10 s from each Client's sampler.
--
--   * stream_tick records, per effect type of the new batch, how many
--     effects it holds (type_effects) and their earliest available_at
--     (type_available_at); the scan that counted them reads them anyway.
--   * A page's settle adds its effects per type to type_passed (store.Settle
--     from the page it delivered, stream_to_rows from the rows it moved):
--     completed, moved to pgoutbox.effects or not, every effect it passed.
--   * store.Stats sums type_effects - type_passed per open batch and type,
--     and reads only the rows not ticked yet and the rows of an open batch
--     that has no counts (ticked before this migration) or is partially
--     settled and not leased (its earliest available_at is not known).
--
-- A batch ticked before this migration has NULL arrays.
ALTER TABLE pgoutbox.stream_batches
    ADD COLUMN type_names text[],
    ADD COLUMN type_effects bigint[],
    ADD COLUMN type_available_at timestamptz[],
    ADD COLUMN type_passed bigint[];
COMMENT ON COLUMN pgoutbox.stream_batches.type_names IS
    'The effect types of the batch (NULL: ticked before migration 00030); type_effects, type_available_at and type_passed are aligned with it.';

-- +goose StatementBegin
-- stream_passed adds p_add (per type of p_add_names) to p_passed, which is
-- aligned with p_names; NULL when p_names is (a batch without counts).
CREATE FUNCTION pgoutbox.stream_passed(p_names text[], p_passed bigint[], p_add_names text[], p_add bigint[])
    RETURNS bigint[]
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT CASE WHEN p_names IS NOT NULL THEN (
        SELECT array_agg(t.n + coalesce((SELECT sum(a.n) FROM unnest(p_add_names, p_add) AS a(name, n)
                                         WHERE a.name = t.name), 0)::bigint ORDER BY t.i)
        FROM unnest(p_names, p_passed) WITH ORDINALITY AS t(name, n, i))
    END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- stream_tick (migration 00027), which also records the new batch's
-- effects per type.
CREATE OR REPLACE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_min   bigint;
    v_max   bigint;
    v_count bigint;
    v_names text[];
    v_n     bigint[];
    v_avail timestamptz[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    SELECT min(t.lo), max(t.hi), coalesce(sum(t.n), 0), array_agg(t.effect_type ORDER BY t.effect_type),
        array_agg(t.n ORDER BY t.effect_type), array_agg(t.avail ORDER BY t.effect_type)
    INTO v_min, v_max, v_count, v_names, v_n, v_avail
    FROM (
        SELECT s.effect_type, min(s.id) AS lo, max(s.id) AS hi, count(*) AS n, min(s.available_at) AS avail
        FROM pgoutbox.stream_after(p_queue, v_prev) s
        WHERE pg_visible_in_snapshot(s.xid, v_snap)
        GROUP BY s.effect_type
    ) t;
    IF v_count = 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through,
        type_names, type_effects, type_available_at, type_passed)
    VALUES (p_queue, coalesce(v_last, 0) + 1, v_snap, v_prev, v_min, v_max, v_count, v_min - 1,
        v_names, v_n, v_avail, array_fill(0::bigint, ARRAY[cardinality(v_names)]));
    RETURN coalesce(v_last, 0) + 1;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- stream_to_rows (migration 00028), which also adds the effects it moved
-- to the batch's type_passed.
CREATE OR REPLACE FUNCTION pgoutbox.stream_to_rows(p_queue text, p_max integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    b       pgoutbox.stream_batches;
    v_n     integer;
    v_last  bigint;
    v_moved integer := 0;
    v_names text[];
    v_add   bigint[];
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
            RETURNING id, effect_type
        ), per_type AS (
            SELECT m.effect_type, count(*) AS n, max(m.id) AS last FROM moved m GROUP BY m.effect_type
        )
        SELECT coalesce(sum(t.n), 0), max(t.last), array_agg(t.effect_type), array_agg(t.n)
        INTO v_n, v_last, v_names, v_add FROM per_type t;
        IF v_n = 0 THEN
            -- effect_keys_insert did not fire: clear the markers here.
            PERFORM set_config('pgoutbox.keys_written', 'off', true), set_config('pgoutbox.routed', 'off', true);
        END IF;
        v_moved := v_moved + v_n;
        IF v_moved < p_max OR v_last = b.max_id THEN
            -- The batch's last page: it is done.
            UPDATE pgoutbox.stream_batches x
            SET done_through = x.max_id, done_at = now(), lease_token = NULL, lease_owner = NULL,
                lease_expires_at = NULL, type_passed = pgoutbox.stream_passed(x.type_names, x.type_passed, v_names, v_add)
            WHERE x.queue = p_queue AND x.id = b.id;
        ELSE
            UPDATE pgoutbox.stream_batches x
            SET done_through = v_last, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
                type_passed = pgoutbox.stream_passed(x.type_names, x.type_passed, v_names, v_add)
            WHERE x.queue = p_queue AND x.id = b.id;
        END IF;
    END LOOP;
    RETURN v_moved;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_min   bigint;
    v_max   bigint;
    v_count bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    SELECT min(s.id), max(s.id), count(*) INTO v_min, v_max, v_count
    FROM pgoutbox.stream_after(p_queue, v_prev) s
    WHERE pg_visible_in_snapshot(s.xid, v_snap);
    IF v_count = 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through)
    VALUES (p_queue, coalesce(v_last, 0) + 1, v_snap, v_prev, v_min, v_max, v_count, v_min - 1);
    RETURN coalesce(v_last, 0) + 1;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_to_rows(p_queue text, p_max integer) RETURNS integer
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
DROP FUNCTION pgoutbox.stream_passed(text[], bigint[], text[], bigint[]);
ALTER TABLE pgoutbox.stream_batches DROP COLUMN type_names, DROP COLUMN type_effects, DROP COLUMN type_available_at,
    DROP COLUMN type_passed;
