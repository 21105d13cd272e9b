-- +goose Up
-- The control plane's SQL replay (docs/controlplane.md, "Replaying dead
-- letters from SQL"):
--   * the old form, boardreadyops_replay_control_plane_outbox(max_rows),
--     keeps its signature and its answer (how many it replayed) and now
--     wakes the queue's workers (NOTIFY) when it replays anything, so a
--     replay is delivered at once instead of at the next poll;
--   * the new form, boardreadyops_replay_control_plane_outbox(max_rows, ids),
--     replays the dead letters among ids (NULL: any, oldest first), at most
--     max_rows, and returns one row per effect it replayed or skipped, with
--     the reason: with ids, every requested id that did not move (missing,
--     another queue, a reconciliation record, not a dead letter, beyond
--     max_rows or locked); without, the queue's reconciliation records,
--     which are never replayed. Bad arguments raise invalid_parameter_value
--     (22023) and change nothing.
-- The new form takes both arguments, always: with a default on either, a
-- call with one argument (f(100), f(NULL)) would stop resolving to the old
-- form. Both move only dead_letter rows of control_plane_outbox, with fresh
-- attempts, due now, exactly like `pgoutbox dlq replay`.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION boardreadyops_replay_control_plane_outbox(max_rows integer DEFAULT 100)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH picked AS (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.queue = 'control_plane_outbox' AND e.state = 'dead_letter'
        ORDER BY e.id
        LIMIT greatest(max_rows, 0)
        FOR UPDATE SKIP LOCKED
    ), replayed AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(), dead_lettered_at = NULL,
            delivery_started_at = NULL
        FROM picked WHERE e.id = picked.id AND e.state = 'dead_letter'
        RETURNING e.id
    )
    SELECT count(*)::integer INTO n FROM replayed;
    IF n > 0 THEN
        PERFORM pg_notify('pgoutbox_effects', 'control_plane_outbox');
    END IF;
    RETURN n;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION boardreadyops_replay_control_plane_outbox(max_rows integer, ids bigint[])
RETURNS TABLE (effect_id bigint, effect_type text, outcome text, state text, reason text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    moved bigint[];
BEGIN
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'boardreadyops_replay_control_plane_outbox: max_rows must be at least 1, got %',
            coalesce(max_rows::text, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF ids IS NOT NULL AND (cardinality(ids) = 0 OR array_position(ids, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION 'boardreadyops_replay_control_plane_outbox: ids must be NULL (any dead letter) or a non-empty array of effect ids without NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    WITH picked AS (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.queue = 'control_plane_outbox' AND e.state = 'dead_letter'
          AND (ids IS NULL OR e.id = ANY (ids))
        ORDER BY e.id
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED
    ), replayed AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(), dead_lettered_at = NULL,
            delivery_started_at = NULL
        FROM picked WHERE e.id = picked.id AND e.state = 'dead_letter'
        RETURNING e.id
    )
    SELECT coalesce(array_agg(r.id), '{}') INTO moved FROM replayed r;
    IF cardinality(moved) > 0 THEN
        PERFORM pg_notify('pgoutbox_effects', 'control_plane_outbox');
    END IF;

    RETURN QUERY
    SELECT e.id, e.effect_type, 'replayed'::text, e.state::text, NULL::text
    FROM pgoutbox.effects e WHERE e.id = ANY (moved)
    UNION ALL
    SELECT r.id, e.effect_type, 'skipped'::text, coalesce(e.state::text, 'missing'),
        CASE
            WHEN e.id IS NULL THEN 'no such effect'
            WHEN e.queue <> 'control_plane_outbox' THEN 'not in queue control_plane_outbox'
            WHEN e.state = 'reconciliation_required' THEN 'reconciliation record: never replayed; decide with pgoutbox reconcile'
            WHEN e.state = 'dead_letter' THEN 'beyond max_rows, or locked by a concurrent transaction: run again'
            ELSE 'not a dead letter'
        END
    FROM (SELECT DISTINCT unnest(ids) AS id) r
    LEFT JOIN pgoutbox.effects e ON e.id = r.id
    WHERE ids IS NOT NULL AND r.id <> ALL (moved)
    UNION ALL
    SELECT e.id, e.effect_type, 'skipped'::text, e.state::text,
        'reconciliation record: never replayed; decide with pgoutbox reconcile'
    FROM pgoutbox.effects e
    WHERE ids IS NULL AND e.queue = 'control_plane_outbox' AND e.state = 'reconciliation_required'
    ORDER BY 1;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION boardreadyops_replay_control_plane_outbox(integer, bigint[]);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION boardreadyops_replay_control_plane_outbox(max_rows integer DEFAULT 100)
RETURNS integer
LANGUAGE sql AS $$
    WITH picked AS (
        SELECT id FROM pgoutbox.effects
        WHERE queue = 'control_plane_outbox' AND state = 'dead_letter'
        ORDER BY id
        LIMIT greatest(max_rows, 0)
        FOR UPDATE SKIP LOCKED
    ), replayed AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(), dead_lettered_at = NULL,
            delivery_started_at = NULL
        FROM picked WHERE e.id = picked.id AND e.state = 'dead_letter'
        RETURNING e.id
    )
    SELECT count(*)::integer FROM replayed
$$;
-- +goose StatementEnd
