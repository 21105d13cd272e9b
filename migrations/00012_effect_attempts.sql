-- +goose Up
-- Each failed attempt of an effect, kept (docs/design.md, "States"; the
-- console's effect page shows them). pgoutbox.effects keeps only the
-- latest error (last_error); an operator reading an incident needs every
-- one: which attempt failed, when, on which worker, why, and where the
-- effect went next.
--
-- Rows are written by the trigger below, on the failure path only: an
-- UPDATE that moves an effect INTO available, dead_letter or
-- reconciliation_required from another state (a failed delivery, a
-- lease the sweeper or an operator recovered, a relay's release, a
-- take-over that finds the effect exhausted or started, a replay). The
-- success path (claim: available → leased; complete: → completed) and
-- lease extensions never pass the trigger's WHEN clause, so they queue no
-- trigger event and write nothing here. The one failure that keeps the
-- state (a broker consumer handing an effect back: leased → leased) is
-- written by its own statement (store.HandBack).
--
-- error is the effect's last_error as the statement set it (the same
-- text, made credential-safe by the target that raised it, guarantee 6),
-- cut to 2000 characters. attempt is the effect's attempt count when the
-- attempt ended (a replay: the attempts the dead letter had; a replay
-- starts the count again at 0). worker is the lease owner whose attempt
-- ended (a sweep: the worker whose lease expired; a replay: none). The
-- trigger functions are SECURITY DEFINER (owner: the role that migrated),
-- so a role that may update or delete effects needs no grant on this
-- table.
CREATE TABLE pgoutbox.effect_attempts (
    effect_id  bigint NOT NULL,
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    attempt    integer NOT NULL CHECK (attempt >= 0),
    at         timestamptz NOT NULL DEFAULT now(),
    outcome    text NOT NULL CHECK (outcome IN ('retrying', 'dead_letter', 'reconciliation_required', 'replayed')),
    error      text CHECK (length(error) <= 2000),
    worker     text CHECK (length(worker) <= 256),
    PRIMARY KEY (effect_id, seq)
);
COMMENT ON TABLE pgoutbox.effect_attempts IS
    'Failed attempts (and replays) of each effect, oldest first by seq; deleted with the effect (docs/console.md).';

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_attempts_record() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.state = 'dead_letter' AND NEW.state = 'available' THEN
        -- A replay: the attempts the dead letter had, no error, no worker.
        INSERT INTO pgoutbox.effect_attempts (effect_id, attempt, outcome)
        VALUES (NEW.id, OLD.attempts, 'replayed');
    ELSE
        INSERT INTO pgoutbox.effect_attempts (effect_id, attempt, outcome, error, worker)
        VALUES (NEW.id, NEW.attempts,
            CASE WHEN NEW.state = 'available' THEN 'retrying' ELSE NEW.state::text END,
            left(NEW.last_error, 2000), left(OLD.lease_owner, 256));
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_attempts_record
    AFTER UPDATE ON pgoutbox.effects
    FOR EACH ROW
    WHEN (NEW.state IS DISTINCT FROM OLD.state
        AND NEW.state IN ('available', 'dead_letter', 'reconciliation_required'))
    EXECUTE FUNCTION pgoutbox.effect_attempts_record();

-- Deleting effects (retention prunes completed ones in batches) deletes
-- their history in one statement per DELETE, not one per row as a foreign
-- key's cascade would: measured on 200,000 effects deleted 1,000 at a time,
-- a cascade cost 6.7× the plain DELETE, this trigger about 1.3×
-- (docs/console.md, "Scale").
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_attempts_delete() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgoutbox.effect_attempts
    WHERE effect_id = ANY(ARRAY(SELECT o.id FROM old_effects o));
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_attempts_delete
    AFTER DELETE ON pgoutbox.effects
    REFERENCING OLD TABLE AS old_effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_attempts_delete();

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.effect_attempts_truncate() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    TRUNCATE pgoutbox.effect_attempts;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_attempts_truncate
    AFTER TRUNCATE ON pgoutbox.effects
    FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_attempts_truncate();

-- +goose Down
DROP TRIGGER effects_attempts_truncate ON pgoutbox.effects;
DROP TRIGGER effects_attempts_delete ON pgoutbox.effects;
DROP TRIGGER effects_attempts_record ON pgoutbox.effects;
DROP FUNCTION pgoutbox.effect_attempts_truncate();
DROP FUNCTION pgoutbox.effect_attempts_delete();
DROP FUNCTION pgoutbox.effect_attempts_record();
DROP TABLE pgoutbox.effect_attempts;
