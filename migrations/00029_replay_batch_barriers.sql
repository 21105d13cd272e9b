-- +goose Up
-- A replayed move-on dead letter waits for a batch delivery of its key
-- (docs/batch-storage.md, docs/ordering.md; TestReplayedMoveOnWaitsForOvertakingDelivery
-- in the batch matrix). A dead letter of a type with OrderingMovesOn lets
-- its key move on; replayed, it must not run beside a later effect of its
-- key that is in delivery (00016). In batch storage that later effect may
-- run from a batch page, which writes nothing until the page settles (or
-- promotes it to a durable lease after PageHold): the claim's probe of the
-- leased rows (notOvertaken) could not see it, and the replayed effect ran
-- beside it.
--
--   * pgoutbox.replay_dead_letters share-locks the oldest open batch of
--     each batch queue it replays a move-on dead letter of (or takes its
--     tick lock when there is none), so no page starts or settles until it
--     commits: a page that starts later sees the replayed effect heading
--     its key and runs none of the key's effects. When the batch is leased
--     it records a barrier for the dead letter: the batch, its lease token
--     and its settled position.
--   * The claim (store.claimSQL, hence pgoutbox.work_claim_rows and
--     pgoutbox.claim; the row-lock claim too) skips an ordered effect while
--     its barrier's batch is still at that position under that unexpired
--     lease: one primary-key probe of pgoutbox.replay_barriers, evaluated
--     only for effects with an ordering key.
--   * A trigger on pgoutbox.stream_batches deletes a batch's barriers and
--     notifies its queue when the batch's settled position, lease token or
--     done mark changes, so the replayed effect is claimed as soon as the
--     page settled.
--
-- Nothing is written per effect delivered from a batch, and pgoutbox.stream
-- gains no index: the cost is on the replay and one probe of a near-empty
-- table per ordered claim candidate, plus the trigger's probe per page.
CREATE TABLE pgoutbox.replay_barriers (
    effect_id    bigint PRIMARY KEY,
    queue        text NOT NULL,
    batch_id     bigint NOT NULL,
    lease_token  uuid NOT NULL,
    done_through bigint NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgoutbox.replay_barriers IS
    'Replayed move-on dead letters that wait for the batch page in flight at their replay (migration 00029, docs/batch-storage.md).';

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.replay_barriers_release() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM pgoutbox.replay_barriers w WHERE w.queue = NEW.queue AND w.batch_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.replay_barriers_release() FROM PUBLIC;

CREATE TRIGGER stream_batches_replay_barriers AFTER UPDATE ON pgoutbox.stream_batches
FOR EACH ROW WHEN (OLD.done_through IS DISTINCT FROM NEW.done_through
                   OR OLD.lease_token IS DISTINCT FROM NEW.lease_token
                   OR NEW.done_at IS NOT NULL)
EXECUTE FUNCTION pgoutbox.replay_barriers_release();

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

-- +goose Down
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
          AND p.ordering_key IS NOT NULL AND p.state = 'leased')))
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

DROP TRIGGER stream_batches_replay_barriers ON pgoutbox.stream_batches;
DROP FUNCTION pgoutbox.replay_barriers_release();
DROP TABLE pgoutbox.replay_barriers;
