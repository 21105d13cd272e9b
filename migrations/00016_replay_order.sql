-- +goose Up
-- A replayed move-on dead letter and the effect that overtook it (issue 28,
-- docs/design.md "Per-key ordering"). A dead letter of a type with
-- EffectType.OrderingMovesOn lets its key move on; replayed, it is
-- available again with a lower id than the effects that overtook it, and
-- the claim's head-of-line check (earlier ids only) made it claimable while
-- a later effect of its key was still in delivery: two at once. Now:
--
--   * The claim also skips an ordered effect while a later effect of its
--     key is leased (in delivery under a durable lease, or handed over to a
--     NATS consumer). effects_ordered_leases_idx answers that with one probe
--     of an index that holds only the leased ordered effects.
--   * A delivery under a row lock leaves its row available (the lock is the
--     lease, nothing is written), so the claim cannot see it. The replay of
--     a move-on dead letter therefore waits for it: pgoutbox.replay_dead_letters
--     takes the ordering locks of the keys it replays (no new effect of them
--     commits until it does) and then a FOR KEY SHARE lock on each key's
--     first blocking effect after the dead letter while that effect is
--     available, which waits for the claim transaction that holds it (at
--     most the queue's RowLockLease, then it is completed or a durable
--     lease) and keeps any other from taking it until the replay commits.
--     A strict dead letter blocks its followers while it is dead, so its
--     replay waits for nothing.
CREATE INDEX effects_ordered_leases_idx ON pgoutbox.effects (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state = 'leased';

-- replay_dead_letters moves up to p_limit dead letters (those in p_ids, or
-- every one when p_ids is empty; narrowed by queue and type, '' for any)
-- back to available with fresh attempts, oldest id first, skipping rows
-- another transaction holds, and returns the rows it moved. Only
-- dead_letter rows match. It runs with the caller's privileges: a role that
-- may not lock and update pgoutbox.effects (pgoutbox_enqueuer) is refused at
-- its first statement, having changed nothing.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.replay_dead_letters(p_ids bigint[], p_queue text, p_type text, p_limit integer)
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
      AND EXISTS (SELECT 1 FROM pgoutbox.ordering_types t
                  WHERE t.effect_type = e.effect_type AND t.dead_letter_moves_on);

    -- ... and each key's first blocking effect after the dead letter is
    -- leased (the claim waits for it), not available, or available and
    -- locked here, after any claim transaction that held it has ended.
    FOR r IN
        SELECT e.id, e.queue, e.ordering_key FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND EXISTS (SELECT 1 FROM pgoutbox.ordering_types t
                      WHERE t.effect_type = e.effect_type AND t.dead_letter_moves_on)
        ORDER BY e.id
    LOOP
        LOOP
            SELECT p.id, p.state::text INTO v_next, v_state FROM pgoutbox.effects p
            WHERE p.queue = r.queue AND p.ordering_key = r.ordering_key AND p.id > r.id
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT EXISTS (
                    SELECT 1 FROM pgoutbox.ordering_types t
                    WHERE t.effect_type = p.effect_type AND t.dead_letter_moves_on))
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

-- +goose Down
DROP FUNCTION pgoutbox.replay_dead_letters(bigint[], text, text, integer);
DROP INDEX pgoutbox.effects_ordered_leases_idx;
