-- +goose Up
-- Lanes (docs/batch-storage.md "Lanes"): several consumers deliver one
-- batch queue at once, each key's effects still in order. Before, a queue's
-- batches were leased one at a time, oldest first, so a batch queue was
-- delivered by one Client at a time however many processes served it.
--
--   * Each stream row has a slot, 0-255, computed from its ordering key (an
--     effect without one: from its id) by a generated column, so no writer
--     computes it (the Go enqueue, effects_to_stream, a plain INSERT).
--   * A queue has QueueConfig.Lanes lanes (queue_storage.lanes, 1-64): a
--     tick splits the rows it closes by lane, lane l holding the slots s
--     with s * lanes / 256 = l, and writes one batch per lane that has rows,
--     recording the lane's slot range (slot_lo, slot_hi).
--   * A batch is leased only when no older open batch of its queue
--     overlaps its slot range (pgoutbox.stream_next_batch). Within one
--     lane count that is "oldest first, per lane"; after a change of the
--     lane count, a new batch waits for every older one its slots overlap,
--     so a key's effects stay in commit order across the change without an
--     epoch. One lane (the default) covers every slot: the former rule.
--   * A page reads its lane's rows through the id index, now (id, slot):
--     the slot test is an index condition, so another lane's rows in the
--     batch's id range are skipped in the index, not fetched.
--   * Everything that asked "is this effect's batch settled" matches the
--     effect's slot to the batch's range: effect_states, stream_pending,
--     the rotation's truncation, the forgetting of settled batches (kept:
--     each slot range's newest), and the replay barrier (the oldest open
--     batch holding the dead letter key's slot).
--
-- Set Lanes above 1 only once every Client runs this version: an older
-- Client's page reads every slot of a batch's id range.
--
-- Adding the stored column rewrites pgoutbox.stream, and the index is
-- rebuilt, under the table's exclusive lock: enqueues to batch queues wait
-- meanwhile. Migrate when the stream is small (drained, or after a
-- rotation emptied the older generations).

-- +goose StatementBegin
-- stream_slot is a stream row's slot: of its ordering key, else of its id.
-- Inlined into the generated column (no SET clause, qualified names).
CREATE FUNCTION pgoutbox.stream_slot(p_ordering_key text, p_id bigint) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (CASE WHEN p_ordering_key IS NULL THEN p_id OPERATOR(pg_catalog.&) 255
                 ELSE pg_catalog.hashtextextended(p_ordering_key, 0) OPERATOR(pg_catalog.&) 255 END)::smallint
$$;
-- +goose StatementEnd

ALTER TABLE pgoutbox.queue_storage
    ADD COLUMN lanes smallint NOT NULL DEFAULT 1 CONSTRAINT queue_storage_lanes CHECK (lanes BETWEEN 1 AND 64);
COMMENT ON COLUMN pgoutbox.queue_storage.lanes IS
    'Lanes of a batch queue (QueueConfig.Lanes): consumers that may deliver it at once, each a range of slots.';
ALTER TABLE pgoutbox.stream
    ADD COLUMN slot smallint NOT NULL GENERATED ALWAYS AS (pgoutbox.stream_slot(ordering_key, id)) STORED;
DROP INDEX pgoutbox.stream_id_idx;
-- A batch's pages, in id order, its lane's slots tested in the index; and
-- an effect by its id.
CREATE INDEX stream_id_idx ON pgoutbox.stream (id, slot);
-- The partitions' indexes keep their former names (the console's plans,
-- operators' queries).
ALTER INDEX pgoutbox.stream_0_id_slot_idx RENAME TO stream_0_id_idx;
ALTER INDEX pgoutbox.stream_1_id_slot_idx RENAME TO stream_1_id_idx;
ALTER INDEX pgoutbox.stream_2_id_slot_idx RENAME TO stream_2_id_idx;
ALTER TABLE pgoutbox.stream_batches
    ADD COLUMN slot_lo smallint NOT NULL DEFAULT 0,
    ADD COLUMN slot_hi smallint NOT NULL DEFAULT 255,
    ADD CONSTRAINT stream_batches_slots CHECK (slot_lo BETWEEN 0 AND slot_hi AND slot_hi <= 255);
COMMENT ON COLUMN pgoutbox.stream_batches.slot_lo IS
    'The batch''s lane: the stream rows whose slot is between slot_lo and slot_hi (migration 00031).';

-- +goose StatementBegin
-- stream_page (migration 00028) of one lane: the rows whose slot is
-- between p_slot_lo and p_slot_hi.
CREATE FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot,
    p_prev pg_snapshot, p_limit integer, p_slot_lo smallint, p_slot_hi smallint) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
    SET enable_bitmapscan = off
    SET enable_seqscan = off
    SET enable_sort = off
    AS $$
    SELECT s.* FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND s.id > p_after AND s.id <= p_max_id AND s.slot >= p_slot_lo AND s.slot <= p_slot_hi
      AND pg_visible_in_snapshot(s.xid, p_snap)
      AND (p_prev IS NULL OR NOT pg_visible_in_snapshot(s.xid, p_prev))
    ORDER BY s.id
    LIMIT p_limit
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.stream_page(text, bigint, bigint, pg_snapshot, pg_snapshot, integer, smallint,
    smallint) FROM PUBLIC;

-- +goose StatementBegin
-- stream_next_batch is the queue's oldest open batch that a consumer may
-- lease now, row-locked (SKIP LOCKED): not leased, or its lease expired,
-- and no older open batch overlaps its slots. The Go claim
-- (store.ClaimBatch) and stream_to_rows lease through it.
CREATE FUNCTION pgoutbox.stream_next_batch(p_queue text) RETURNS SETOF pgoutbox.stream_batches
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
    SELECT b.* FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue AND b.done_at IS NULL
      AND (b.lease_token IS NULL OR b.lease_expires_at < now())
      AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.stream_batches x
        WHERE x.queue = p_queue AND x.done_at IS NULL AND x.id < b.id
          AND x.slot_lo <= b.slot_hi AND b.slot_lo <= x.slot_hi)
    ORDER BY b.id
    LIMIT 1
    FOR UPDATE OF b SKIP LOCKED
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.stream_next_batch(text) FROM PUBLIC;

-- +goose StatementBegin
-- stream_tick (migrations 00027, 00030) by lane: the rows committed since
-- the previous tick become one batch per lane of the queue that has rows
-- (queue_storage.lanes read now; a queue without a row has one lane), in
-- lane order, each with its slot range and its counts per type. Returns
-- the first new batch's id, or NULL when no row was committed.
CREATE OR REPLACE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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

-- +goose StatementBegin
-- stream_to_rows (migrations 00028, 00030) by lane: each batch it moves is
-- one stream_next_batch returns, read through its lane's slots.
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
    -- Batch after batch, each the oldest a consumer may lease
    -- (stream_next_batch), until p_max effects moved.
    WHILE v_moved < p_max LOOP
        SELECT x.* INTO b FROM pgoutbox.stream_next_batch(p_queue) x;
        IF NOT FOUND THEN
            EXIT;
        END IF;
        WITH page AS (
            SELECT * FROM pgoutbox.stream_page(p_queue, b.done_through, b.max_id, b.snap, b.prev_snap, p_max - v_moved,
                b.slot_lo, b.slot_hi)
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

-- +goose StatementBegin
-- stream_maintain (migration 00027) by lane: a closed generation is
-- truncated once every queue with rows in it has ticked after the close
-- and settled every batch up to that tick, in every lane; of the settled
-- batches, each slot range's newest is kept.
CREATE OR REPLACE FUNCTION pgoutbox.stream_maintain(p_rotate_after interval, p_retention interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    g         record;
    v_cur     record;
    v_settled boolean;
    v_n       integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgoutbox.stream_maintain', 0)) THEN
        RETURN 0; -- another process maintains the stream right now
    END IF;
    FOR g IN SELECT * FROM pgoutbox.stream_generations
             WHERE state = 'closed' AND closed_at <= now() - p_retention ORDER BY closed_at LOOP
        SELECT bool_and(NOT EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = g.gen AND s.queue = q.queue)
                        OR (EXISTS (SELECT 1 FROM pgoutbox.stream_batches b
                                    WHERE b.queue = q.queue AND pg_visible_in_snapshot(g.closed_xid, b.snap))
                            AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream_batches o
                                            WHERE o.queue = q.queue AND o.done_at IS NULL
                                              AND (o.prev_snap IS NULL
                                                   OR NOT pg_visible_in_snapshot(g.closed_xid, o.prev_snap)))))
        INTO v_settled
        FROM pgoutbox.queue_storage q;
        IF coalesce(v_settled, true) THEN
            BEGIN
                PERFORM set_config('lock_timeout', '500ms', true);
                EXECUTE format('TRUNCATE pgoutbox.%I', 'stream_' || g.gen);
                UPDATE pgoutbox.stream_generations
                SET state = 'empty', opened_at = NULL, closed_at = NULL, closed_xid = NULL
                WHERE gen = g.gen;
                v_n := v_n + 1;
            EXCEPTION WHEN lock_not_available THEN
                NULL; -- a reader holds it: the next call tries again
            END;
        END IF;
    END LOOP;

    SELECT * INTO v_cur FROM pgoutbox.stream_generations WHERE state = 'current';
    IF v_cur.opened_at <= now() - p_rotate_after
       AND EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = v_cur.gen)
       AND (SELECT state FROM pgoutbox.stream_generations WHERE gen = (v_cur.gen + 1) % 3) = 'empty' THEN
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream', 0));
            UPDATE pgoutbox.stream_generations
            SET state = 'closed', closed_at = now(), closed_xid = pg_current_xact_id()
            WHERE gen = v_cur.gen AND state = 'current';
            UPDATE pgoutbox.stream_generations SET state = 'current', opened_at = now()
            WHERE gen = (v_cur.gen + 1) % 3;
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- an enqueue is still open: the next call tries again
        END;
    END IF;

    -- Settled batches but the newest of each queue's slot range: it tells
    -- that the range's earlier rows are settled (pgoutbox.effect_states),
    -- and the newest batch, kept so, is the next tick's lower bound.
    DELETE FROM pgoutbox.stream_batches b
    WHERE b.done_at IS NOT NULL
      AND b.id < (SELECT max(l.id) FROM pgoutbox.stream_batches l
                  WHERE l.queue = b.queue AND l.slot_lo = b.slot_lo AND l.slot_hi = b.slot_hi AND l.done_at IS NOT NULL);
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- replay_dead_letters (migration 00029): the batch it share-locks for a
-- move-on dead letter is the oldest open batch holding its key's slot.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.replay_dead_letters(p_ids bigint[], p_queue text, p_type text, p_limit integer)
RETURNS TABLE (id bigint, queue text, effect_type text, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids   bigint[];
    v_next  bigint;
    v_state text;
    r       record;
    v_queue  text;
    v_head   bigint;
    v_locked boolean;
    v_batch  pgoutbox.stream_batches;
    v_slot   smallint;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids FROM (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.state = 'dead_letter'
          AND (cardinality(p_ids) = 0 OR e.id = ANY(p_ids))
          AND (p_queue = '' OR e.queue = p_queue) AND (p_type = '' OR e.effect_type = p_type)
        ORDER BY e.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- Batch storage: a later effect of a move-on dead letter's key may be
    -- in delivery from a batch page, which writes no row until it settles.
    -- Each queue of such a dead letter that is a batch queue, or still has
    -- open batches, gets, for each slot of their keys (migration 00031), its
    -- oldest open batch holding the slot (the only one of them a consumer
    -- may lease) share-locked, so no page of it starts or settles, and no
    -- consumer leases it, before this transaction commits; with no open
    -- batch, its tick lock, so none is closed meanwhile. A page that starts
    -- after the commit finds the replayed effect heading its key
    -- (store.HeldKeys) and runs none of the key's effects. When the batch
    -- is leased (even past its expiry: its holder may still extend it),
    -- the page in flight may have read the key's state before the replay:
    -- the dead letter gets a barrier (pgoutbox.replay_barriers) that keeps
    -- the claim off it until that page settles, the lease is released or
    -- taken over, or it expires. Taken before the ordering locks: a settle
    -- waits for this transaction at its first statement, holding nothing,
    -- so its OnComplete transitions, which may take ordering locks, never
    -- wait for this transaction while it waits for their batch.
    FOR v_queue, v_slot IN
        SELECT DISTINCT e.queue, pgoutbox.stream_slot(e.ordering_key, e.id) FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
          AND (EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = e.queue AND s.storage = 'batch')
               OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = e.queue AND x.done_at IS NULL))
        ORDER BY 1, 2
    LOOP
        v_locked := false;
        LOOP
            SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.done_at IS NULL AND v_slot BETWEEN x.slot_lo AND x.slot_hi
            ORDER BY x.id LIMIT 1;
            IF NOT FOUND THEN
                PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || v_queue, 0));
                SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
                WHERE x.queue = v_queue AND x.done_at IS NULL AND v_slot BETWEEN x.slot_lo AND x.slot_hi
                ORDER BY x.id LIMIT 1;
                EXIT WHEN NOT FOUND;
            END IF;
            SELECT x.* INTO v_batch FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.id = v_head AND x.done_at IS NULL
            FOR SHARE;
            IF FOUND THEN
                v_locked := true;
                EXIT;
            END IF;
        END LOOP;
        IF v_locked AND v_batch.lease_token IS NOT NULL THEN
            INSERT INTO pgoutbox.replay_barriers AS w (effect_id, queue, batch_id, lease_token, done_through)
            SELECT e.id, e.queue, v_batch.id, v_batch.lease_token, v_batch.done_through
            FROM pgoutbox.effects e
            WHERE e.id = ANY(v_ids) AND e.queue = v_queue AND e.ordering_key IS NOT NULL
              AND pgoutbox.stream_slot(e.ordering_key, e.id) = v_slot
              AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
            ON CONFLICT (effect_id) DO UPDATE
            SET queue = excluded.queue, batch_id = excluded.batch_id, lease_token = excluded.lease_token,
                done_through = excluded.done_through, created_at = now();
        END IF;
    END LOOP;

    -- The move-on dead letters among them: no new effect of their keys
    -- commits before this transaction does (pgoutbox.ordering_lock, in one
    -- canonical order) ...
    PERFORM pgoutbox.ordering_lock(array_agg(e.queue), array_agg(e.ordering_key))
    FROM pgoutbox.effects e
    WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
      AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type);

    -- ... and each key's first blocking effect after the dead letter is
    -- leased (the claim waits for it), not available, or available and
    -- locked here, after any claim transaction that held it has ended.
    FOR r IN
        SELECT e.id, e.queue, e.ordering_key FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
        ORDER BY e.id
    LOOP
        LOOP
            SELECT p.id, p.state::text INTO v_next, v_state FROM pgoutbox.effects p
            WHERE p.queue = r.queue AND p.ordering_key = r.ordering_key AND p.id > r.id
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT pgoutbox.dead_letter_moves_on(p.queue, p.effect_type))
            ORDER BY p.id
            LIMIT 1;
            EXIT WHEN NOT FOUND OR v_state <> 'available';
            PERFORM 1 FROM pgoutbox.effects p WHERE p.id = v_next AND p.state::text = 'available' FOR KEY SHARE OF p;
            EXIT WHEN FOUND;
        END LOOP;
    END LOOP;

    RETURN QUERY
    WITH moved AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(),
            dead_lettered_at = NULL, delivery_started_at = NULL
        WHERE e.id = ANY(v_ids) AND e.state::text = 'dead_letter'
        RETURNING e.id, e.queue, e.effect_type, e.state::text AS state
    )
    SELECT m.id, m.queue, m.effect_type, m.state FROM moved m ORDER BY m.id;
END;
$$;
-- +goose StatementEnd

-- effect_states (migration 00027) by lane: a stream effect's batch holds
-- its slot. A settled batch that sees it and holds its slot tells it is
-- settled: that batch was leased only once every older batch its slots
-- overlap was settled, the effect's own batch among them.
CREATE OR REPLACE VIEW pgoutbox.effect_states AS
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

-- stream_pending (migration 00027) by lane: the rows committed after the
-- snapshot before the queue's oldest open batch (or, with none open, its
-- newest batch's), less those an open batch settled already and those of
-- a settled batch (a lane settled past another's).
CREATE OR REPLACE VIEW pgoutbox.stream_pending AS
SELECT s.id, q.queue, s.effect_type, s.available_at, s.created_at,
    (CASE WHEN o.lease_token IS NOT NULL AND o.lease_expires_at > now() THEN 'leased' ELSE 'available' END
    )::pgoutbox.effect_state AS state
FROM pgoutbox.queue_storage q
LEFT JOIN LATERAL (
    SELECT n.snap FROM pgoutbox.stream_batches n WHERE n.queue = q.queue ORDER BY n.id DESC LIMIT 1
) newest ON true
LEFT JOIN LATERAL (
    SELECT d.prev_snap, true AS open FROM pgoutbox.stream_batches d
    WHERE d.queue = q.queue AND d.done_at IS NULL ORDER BY d.id LIMIT 1
) oldest ON true
CROSS JOIN LATERAL pgoutbox.stream_after(q.queue,
    CASE WHEN oldest.open THEN oldest.prev_snap ELSE newest.snap END) s
LEFT JOIN pgoutbox.stream_batches o
    ON o.queue = q.queue AND o.done_at IS NULL AND s.id BETWEEN o.min_id AND o.max_id
   AND s.slot BETWEEN o.slot_lo AND o.slot_hi
   AND pg_visible_in_snapshot(s.xid, o.snap)
   AND (o.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, o.prev_snap))
WHERE CASE WHEN o.queue IS NULL THEN NOT coalesce(pg_visible_in_snapshot(s.xid, newest.snap), false)
           ELSE NOT coalesce(o.done_through >= s.id, false) END;

-- +goose Down
CREATE OR REPLACE VIEW pgoutbox.effect_states AS
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
    WHERE b.queue = s.queue AND pg_visible_in_snapshot(s.xid, b.snap)
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
CREATE OR REPLACE VIEW pgoutbox.stream_pending AS
SELECT s.id, q.queue, s.effect_type, s.available_at, s.created_at,
    (CASE WHEN o.lease_token IS NOT NULL AND o.lease_expires_at > now() THEN 'leased' ELSE 'available' END
    )::pgoutbox.effect_state AS state
FROM pgoutbox.queue_storage q
LEFT JOIN LATERAL (
    SELECT d.snap FROM pgoutbox.stream_batches d
    WHERE d.queue = q.queue AND d.done_at IS NOT NULL ORDER BY d.id DESC LIMIT 1
) last ON true
CROSS JOIN LATERAL pgoutbox.stream_after(q.queue, last.snap) s
LEFT JOIN pgoutbox.stream_batches o
    ON o.queue = q.queue AND o.done_at IS NULL AND s.id BETWEEN o.min_id AND o.max_id
   AND pg_visible_in_snapshot(s.xid, o.snap)
   AND (o.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, o.prev_snap))
WHERE NOT coalesce(o.done_through >= s.id, false);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_maintain(p_rotate_after interval, p_retention interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    g         record;
    v_cur     record;
    v_settled boolean;
    v_n       integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgoutbox.stream_maintain', 0)) THEN
        RETURN 0; -- another process maintains the stream right now
    END IF;
    FOR g IN SELECT * FROM pgoutbox.stream_generations
             WHERE state = 'closed' AND closed_at <= now() - p_retention ORDER BY closed_at LOOP
        SELECT bool_and(NOT EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = g.gen AND s.queue = q.queue)
                        OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches b
                                   WHERE b.queue = q.queue AND b.done_at IS NOT NULL
                                     AND pg_visible_in_snapshot(g.closed_xid, b.snap)))
        INTO v_settled
        FROM pgoutbox.queue_storage q;
        IF coalesce(v_settled, true) THEN
            BEGIN
                PERFORM set_config('lock_timeout', '500ms', true);
                EXECUTE format('TRUNCATE pgoutbox.%I', 'stream_' || g.gen);
                UPDATE pgoutbox.stream_generations
                SET state = 'empty', opened_at = NULL, closed_at = NULL, closed_xid = NULL
                WHERE gen = g.gen;
                v_n := v_n + 1;
            EXCEPTION WHEN lock_not_available THEN
                NULL; -- a reader holds it: the next call tries again
            END;
        END IF;
    END LOOP;

    SELECT * INTO v_cur FROM pgoutbox.stream_generations WHERE state = 'current';
    IF v_cur.opened_at <= now() - p_rotate_after
       AND EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = v_cur.gen)
       AND (SELECT state FROM pgoutbox.stream_generations WHERE gen = (v_cur.gen + 1) % 3) = 'empty' THEN
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream', 0));
            UPDATE pgoutbox.stream_generations
            SET state = 'closed', closed_at = now(), closed_xid = pg_current_xact_id()
            WHERE gen = v_cur.gen AND state = 'current';
            UPDATE pgoutbox.stream_generations SET state = 'current', opened_at = now()
            WHERE gen = (v_cur.gen + 1) % 3;
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- an enqueue is still open: the next call tries again
        END;
    END IF;

    -- Settled batches but each queue's newest: that one's snapshot is the
    -- next tick's lower bound.
    DELETE FROM pgoutbox.stream_batches b
    WHERE b.done_at IS NOT NULL
      AND b.id < (SELECT max(l.id) FROM pgoutbox.stream_batches l WHERE l.queue = b.queue AND l.done_at IS NOT NULL);
    RETURN v_n;
END;
$$;
-- +goose StatementEnd
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
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.replay_dead_letters(p_ids bigint[], p_queue text, p_type text, p_limit integer)
RETURNS TABLE (id bigint, queue text, effect_type text, state text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_ids   bigint[];
    v_next  bigint;
    v_state text;
    r       record;
    v_queue  text;
    v_head   bigint;
    v_locked boolean;
    v_batch  pgoutbox.stream_batches;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids FROM (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.state = 'dead_letter'
          AND (cardinality(p_ids) = 0 OR e.id = ANY(p_ids))
          AND (p_queue = '' OR e.queue = p_queue) AND (p_type = '' OR e.effect_type = p_type)
        ORDER BY e.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- Batch storage: a later effect of a move-on dead letter's key may be
    -- in delivery from a batch page, which writes no row until it settles.
    -- Each queue of such a dead letter that is a batch queue, or still has
    -- open batches, gets its oldest open batch (the only one a consumer may
    -- lease) share-locked, so no page of it starts or settles, and no
    -- consumer leases it, before this transaction commits; with no open
    -- batch, its tick lock, so none is closed meanwhile. A page that starts
    -- after the commit finds the replayed effect heading its key
    -- (store.HeldKeys) and runs none of the key's effects. When the batch
    -- is leased (even past its expiry: its holder may still extend it),
    -- the page in flight may have read the key's state before the replay:
    -- the dead letter gets a barrier (pgoutbox.replay_barriers) that keeps
    -- the claim off it until that page settles, the lease is released or
    -- taken over, or it expires. Taken before the ordering locks: a settle
    -- waits for this transaction at its first statement, holding nothing,
    -- so its OnComplete transitions, which may take ordering locks, never
    -- wait for this transaction while it waits for their batch.
    FOR v_queue IN
        SELECT DISTINCT e.queue FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
          AND (EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = e.queue AND s.storage = 'batch')
               OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = e.queue AND x.done_at IS NULL))
        ORDER BY e.queue
    LOOP
        v_locked := false;
        LOOP
            SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.done_at IS NULL ORDER BY x.id LIMIT 1;
            IF NOT FOUND THEN
                PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || v_queue, 0));
                SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
                WHERE x.queue = v_queue AND x.done_at IS NULL ORDER BY x.id LIMIT 1;
                EXIT WHEN NOT FOUND;
            END IF;
            SELECT x.* INTO v_batch FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.id = v_head AND x.done_at IS NULL
            FOR SHARE;
            IF FOUND THEN
                v_locked := true;
                EXIT;
            END IF;
        END LOOP;
        IF v_locked AND v_batch.lease_token IS NOT NULL THEN
            INSERT INTO pgoutbox.replay_barriers AS w (effect_id, queue, batch_id, lease_token, done_through)
            SELECT e.id, e.queue, v_batch.id, v_batch.lease_token, v_batch.done_through
            FROM pgoutbox.effects e
            WHERE e.id = ANY(v_ids) AND e.queue = v_queue AND e.ordering_key IS NOT NULL
              AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
            ON CONFLICT (effect_id) DO UPDATE
            SET queue = excluded.queue, batch_id = excluded.batch_id, lease_token = excluded.lease_token,
                done_through = excluded.done_through, created_at = now();
        END IF;
    END LOOP;

    -- The move-on dead letters among them: no new effect of their keys
    -- commits before this transaction does (pgoutbox.ordering_lock, in one
    -- canonical order) ...
    PERFORM pgoutbox.ordering_lock(array_agg(e.queue), array_agg(e.ordering_key))
    FROM pgoutbox.effects e
    WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
      AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type);

    -- ... and each key's first blocking effect after the dead letter is
    -- leased (the claim waits for it), not available, or available and
    -- locked here, after any claim transaction that held it has ended.
    FOR r IN
        SELECT e.id, e.queue, e.ordering_key FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
        ORDER BY e.id
    LOOP
        LOOP
            SELECT p.id, p.state::text INTO v_next, v_state FROM pgoutbox.effects p
            WHERE p.queue = r.queue AND p.ordering_key = r.ordering_key AND p.id > r.id
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT pgoutbox.dead_letter_moves_on(p.queue, p.effect_type))
            ORDER BY p.id
            LIMIT 1;
            EXIT WHEN NOT FOUND OR v_state <> 'available';
            PERFORM 1 FROM pgoutbox.effects p WHERE p.id = v_next AND p.state::text = 'available' FOR KEY SHARE OF p;
            EXIT WHEN FOUND;
        END LOOP;
    END LOOP;

    RETURN QUERY
    WITH moved AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(),
            dead_lettered_at = NULL, delivery_started_at = NULL
        WHERE e.id = ANY(v_ids) AND e.state::text = 'dead_letter'
        RETURNING e.id, e.queue, e.effect_type, e.state::text AS state
    )
    SELECT m.id, m.queue, m.effect_type, m.state FROM moved m ORDER BY m.id;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION pgoutbox.stream_next_batch(text);
DROP FUNCTION pgoutbox.stream_page(text, bigint, bigint, pg_snapshot, pg_snapshot, integer, smallint, smallint);
ALTER TABLE pgoutbox.stream_batches DROP CONSTRAINT stream_batches_slots, DROP COLUMN slot_lo, DROP COLUMN slot_hi;
DROP INDEX pgoutbox.stream_id_idx;
ALTER TABLE pgoutbox.stream DROP COLUMN slot;
CREATE INDEX stream_id_idx ON pgoutbox.stream (id);
ALTER TABLE pgoutbox.queue_storage DROP COLUMN lanes;
DROP FUNCTION pgoutbox.stream_slot(text, bigint);
