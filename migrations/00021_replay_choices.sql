-- +goose Up
-- The replay of a move-on dead letter reads the ordering choice per queue
-- and effect type (00018) too. pgoutbox.replay_dead_letters (00016) decided
-- which dead letters let their key move on from pgoutbox.ordering_types
-- alone, which this version no longer writes: a replayed move-on dead letter
-- of a Client of this version would not have waited for the effect of its key
-- in delivery. pgoutbox.dead_letter_moves_on is the choice as the claim reads
-- it (internal/store's orderingMovesOnSQL): the (queue, type) row of
-- ordering_choices, else the type's ordering_types row, else strict.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.dead_letter_moves_on(p_queue text, p_type text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p_queue AND c.effect_type = p_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p_type),
        false)
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION pgoutbox.dead_letter_moves_on(text, text) FROM PUBLIC;

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

-- +goose Down
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

DROP FUNCTION pgoutbox.dead_letter_moves_on(text, text);
