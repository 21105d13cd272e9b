-- +goose Up
-- Idempotency keys move out of the effects table into a narrow table written
-- once, at enqueue. Every state change of an effect (claim, completion,
-- retry) is a non-HOT update, and a non-HOT update inserts a new entry into
-- every index of the table: with the unique (queue, idempotency_key) index on
-- pgoutbox.effects each state change wrote a random page of an index that
-- grows with retention, so under sustained load checkpoints came every few
-- seconds and full-page images of that index dominated the WAL
-- (docs/benchmarks.md, "10-minute sustained run"). The effects table keeps
-- the key as a column (workers read it with the row) but no longer indexes it.
--
-- The invariant "one effect per (queue, key), and every effect has its key
-- row" is kept by the database, whatever writes the rows:
--   * the library's enqueue writes the key rows first (INSERT ... ON CONFLICT
--     DO NOTHING, which waits for a concurrent enqueuer of the same key like
--     the old unique index did) and marks the statement so that the insert
--     trigger skips it;
--   * any other INSERT into pgoutbox.effects gets its key rows from that
--     statement trigger (a duplicate key raises unique_violation on
--     effect_keys_pkey);
--   * deleting an effect deletes its key row, truncating the effects
--     truncates the keys;
--   * the queue and key of an effect cannot be changed.
CREATE TABLE pgoutbox.effect_keys (
    queue            text NOT NULL,
    idempotency_key  text NOT NULL,
    effect_id        bigint NOT NULL,
    PRIMARY KEY (queue, idempotency_key)
);

INSERT INTO pgoutbox.effect_keys (queue, idempotency_key, effect_id)
SELECT queue, idempotency_key, id FROM pgoutbox.effects;

ALTER TABLE pgoutbox.effects DROP CONSTRAINT effects_queue_key;

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_keys_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- The library's enqueue statement writes its key rows itself, before
    -- the effects, and says so in a transaction-local setting that lives
    -- until this trigger, which fires at the end of that very statement.
    IF current_setting('pgoutbox.keys_written', true) = 'on' THEN
        PERFORM set_config('pgoutbox.keys_written', 'off', true);
        RETURN NULL;
    END IF;
    -- Any other INSERT: every row gets its key row here, and a key already
    -- taken raises unique_violation (effect_keys_pkey).
    INSERT INTO pgoutbox.effect_keys (queue, idempotency_key, effect_id)
    SELECT n.queue, n.idempotency_key, n.id FROM new_effects n;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_keys_insert
    AFTER INSERT ON pgoutbox.effects
    REFERENCING NEW TABLE AS new_effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_keys_insert();

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_keys_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- One primary-key probe per deleted effect, then a TID scan, whatever
    -- the statistics say (a join could pick a sort of the whole key table).
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

-- TRUNCATE fires no DELETE trigger: it empties the key table too.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_keys_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE pgoutbox.effect_keys;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_keys_truncate
    AFTER TRUNCATE ON pgoutbox.effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_keys_truncate();

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_keys_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.queue IS DISTINCT FROM OLD.queue OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key THEN
        RAISE EXCEPTION 'pgoutbox: the queue and idempotency key of effect % cannot be changed', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'effects_key_immutable';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

-- Fires only for UPDATEs that name these columns, so the engine's own
-- updates pay nothing for it.
CREATE TRIGGER effects_key_immutable
    BEFORE UPDATE OF queue, idempotency_key ON pgoutbox.effects
    FOR EACH ROW EXECUTE FUNCTION pgoutbox.effect_keys_immutable();

-- +goose Down
DROP TRIGGER effects_key_immutable ON pgoutbox.effects;
DROP TRIGGER effects_keys_truncate ON pgoutbox.effects;
DROP TRIGGER effects_keys_delete ON pgoutbox.effects;
DROP TRIGGER effects_keys_insert ON pgoutbox.effects;
DROP FUNCTION pgoutbox.effect_keys_immutable();
DROP FUNCTION pgoutbox.effect_keys_truncate();
DROP FUNCTION pgoutbox.effect_keys_delete();
DROP FUNCTION pgoutbox.effect_keys_insert();
ALTER TABLE pgoutbox.effects ADD CONSTRAINT effects_queue_key UNIQUE (queue, idempotency_key);
DROP TABLE pgoutbox.effect_keys;
