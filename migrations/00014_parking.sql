-- +goose Up
-- Parking (docs/design.md "Per-key ordering", "Parking"). A follower of a
-- blocked ordering key is made invisible to the claim scan: its due time
-- moves to parked_due_at and its available_at becomes 'infinity', outside
-- the claim index's range (available_at <= now()). A hot key's backlog then
-- costs the claim nothing, instead of one head-of-line probe per waiting row
-- on every claim of the queue.
--
--   * parked_due_at: NULL (not parked, the default) or the parked effect's
--     real due time. Only available effects are parked.
--   * Parking is lazy: store.Park (run by the sweeper) parks the available
--     ordered effects that have a blocking predecessor (and, by default,
--     at least 32 earlier effects of their key not completed), holding a share lock
--     on that predecessor (SKIP LOCKED: it never waits) until it commits.
--   * Un-parking: when an ordered effect is completed or dead-lettered
--     (effects_unpark_next), the key's first blocking effect is un-parked
--     if it is parked. The predecessor's update waits for a parker's share
--     lock, so the trigger's statement sees every committed park.
--   * Safety net: store.Unpark (run by the sweeper) un-parks every parked
--     effect without a blocking predecessor (an operator's action on two
--     effects of one key at once, a deleted blocker).
--   * The claim keeps its head-of-line check: an un-parked effect that is
--     still blocked is skipped, never delivered out of order.
ALTER TABLE pgoutbox.effects ADD COLUMN parked_due_at timestamptz;

CREATE INDEX effects_parked_idx ON pgoutbox.effects (queue, ordering_key, id)
    WHERE parked_due_at IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.unpark_next() RETURNS trigger
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

CREATE TRIGGER effects_unpark_next
    AFTER UPDATE OF state ON pgoutbox.effects
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.state IN ('completed', 'dead_letter') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION pgoutbox.unpark_next();

-- +goose Down
DROP TRIGGER effects_unpark_next ON pgoutbox.effects;
DROP FUNCTION pgoutbox.unpark_next();
UPDATE pgoutbox.effects SET available_at = parked_due_at WHERE parked_due_at IS NOT NULL;
DROP INDEX pgoutbox.effects_parked_idx;
ALTER TABLE pgoutbox.effects DROP COLUMN parked_due_at;
