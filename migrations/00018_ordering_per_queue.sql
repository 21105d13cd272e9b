-- +goose Up
-- Ordering choices per queue and effect type (issue 28, docs/design.md
-- "Per-key ordering"). pgoutbox.ordering_types (00013) recorded whether a
-- dead letter lets its ordering key move on per effect type alone, for every
-- queue: the last Client to start won, and a rolling deploy that changed
-- EffectType.OrderingMovesOn in one queue's Clients flipped every queue
-- that has a type of that name back and forth.
--
--   * pgoutbox.ordering_choices records the choice per (queue, effect
--     type). Clients, the NATS relay and consumer and the projection write
--     the rows of their own queues when they start (RegisterOrdering): a
--     registration in one queue changes no other queue. A registration that
--     changes a recorded choice is logged (a warning naming the queue, the
--     type, the former choice and when it was recorded), not refused: in a
--     rolling deploy that changes the choice, the new instances must start
--     while the old ones still run.
--   * Existing rows are migrated: each ordering_types row is copied to the
--     queues that hold ordered effects of its type that are not completed
--     (effects_ordering_idx), the effects the choice decides today.
--   * pgoutbox.ordering_types is kept, no longer written by this version,
--     and read as the fallback for a (queue, type) without a row of its own:
--     a Client of an earlier version that starts during the deploy still
--     writes it (its statement names that table's key), and a queue that no
--     registration of this version has reached yet keeps the choice it had.
--   * The claim, Park, blocked-keys and the un-park trigger
--     (effects_unpark_next, redefined here) read the choice as: the
--     (queue, type) row, else the type's ordering_types row, else strict.
CREATE TABLE pgoutbox.ordering_choices (
    queue                 text NOT NULL CHECK (queue <> '' AND octet_length(queue) <= 128),
    effect_type           text NOT NULL CHECK (effect_type <> '' AND octet_length(effect_type) <= 128),
    dead_letter_moves_on  boolean NOT NULL DEFAULT false,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, effect_type)
);
COMMENT ON TABLE pgoutbox.ordering_choices IS
    'Per queue and effect type: does a dead letter let its ordering key move on (true) or block it until replayed (false)? Written by pgoutbox Clients, the NATS relay and consumer at start from EffectType.OrderingMovesOn; absent: pgoutbox.ordering_types, then strict.';
COMMENT ON TABLE pgoutbox.ordering_types IS
    'Before migration 00018: the ordering choice per effect type for every queue. Read only as the fallback of pgoutbox.ordering_choices; written only by Clients of earlier versions.';

INSERT INTO pgoutbox.ordering_choices (queue, effect_type, dead_letter_moves_on, updated_at)
SELECT q.queue, t.effect_type, t.dead_letter_moves_on, t.updated_at
FROM pgoutbox.ordering_types t
JOIN (
    SELECT DISTINCT e.queue, e.effect_type FROM pgoutbox.effects e
    WHERE e.ordering_key IS NOT NULL AND e.state <> 'completed'
) q ON q.effect_type = t.effect_type
ON CONFLICT DO NOTHING;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.unpark_next() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgoutbox.effects e
    SET available_at = e.parked_due_at, parked_due_at = NULL
    WHERE e.id = (
            SELECT p.id FROM pgoutbox.effects p
            WHERE p.queue = NEW.queue AND p.ordering_key = NEW.ordering_key
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT coalesce(
                    (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
                     WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
                    (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
                     WHERE t.effect_type = p.effect_type),
                    false))
            ORDER BY p.id
            LIMIT 1)
      AND e.parked_due_at IS NOT NULL;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.unpark_next() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgoutbox.effects e
    SET available_at = e.parked_due_at, parked_due_at = NULL
    WHERE e.id = (
            SELECT p.id FROM pgoutbox.effects p
            WHERE p.queue = NEW.queue AND p.ordering_key = NEW.ordering_key
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT EXISTS (
                    SELECT 1 FROM pgoutbox.ordering_types t
                    WHERE t.effect_type = p.effect_type AND t.dead_letter_moves_on))
            ORDER BY p.id
            LIMIT 1)
      AND e.parked_due_at IS NOT NULL;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
COMMENT ON TABLE pgoutbox.ordering_types IS
    'Per effect type: does a dead letter let its ordering key move on (true) or block it until replayed (false, the default when absent)? Written by pgoutbox Clients at start from EffectType.OrderingMovesOn.';
DROP TABLE pgoutbox.ordering_choices;
