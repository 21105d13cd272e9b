-- +goose Up
-- Idempotency keys outlive their effects (docs/design.md, "Effects and
-- idempotency"). Until now deleting an effect deleted its key row, so once
-- retention pruned a completed effect (24 h by default) the same key
-- enqueued again created and delivered a second effect. A key row now stays
-- while its effect exists and, after the effect is gone, until it is older
-- than the key retention (Config.KeyRetention, OUTBOX_KEY_RETENTION, 7 days
-- by default): the library's key pruner (store.PruneKeys) deletes it then.
-- Within that window, enqueuing the key returns the original (possibly
-- pruned) effect's id and writes nothing.
--
-- created_at is when the key was first enqueued. Rows that exist when this
-- migration runs get the migration's time: they are kept at least one key
-- retention from now, never less.
ALTER TABLE pgoutbox.effect_keys ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();

-- The key pruner walks keys by age. New keys land at the right edge of
-- this index, so it costs an enqueue one append, not a random page write.
CREATE INDEX effect_keys_created_idx ON pgoutbox.effect_keys (created_at);

-- Deleting an effect (retention, or an operator's DELETE) no longer deletes
-- its key. TRUNCATE still empties the key table: it resets the engine.
DROP TRIGGER effects_keys_delete ON pgoutbox.effects;
DROP FUNCTION pgoutbox.effect_keys_delete();

-- +goose Down
-- Keys whose effect is gone are deleted, as the old trigger would have.
DELETE FROM pgoutbox.effect_keys k
WHERE NOT EXISTS (SELECT 1 FROM pgoutbox.effects e WHERE e.id = k.effect_id);

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_keys_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgoutbox.effect_keys
    WHERE ctid = ANY(ARRAY(
        SELECT k.ctid FROM old_effects o
        CROSS JOIN LATERAL (
            SELECT x.ctid FROM pgoutbox.effect_keys x
            WHERE x.queue = o.queue AND x.idempotency_key = o.idempotency_key AND x.effect_id = o.id
            LIMIT 1
        ) k
    ));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_keys_delete
    AFTER DELETE ON pgoutbox.effects
    REFERENCING OLD TABLE AS old_effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_keys_delete();

DROP INDEX pgoutbox.effect_keys_created_idx;
ALTER TABLE pgoutbox.effect_keys DROP COLUMN created_at;
