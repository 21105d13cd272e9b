-- +goose Up
-- NOTIFY serializes the commits of the transactions that raise it (a
-- database-wide lock is held through commit), which capped single-effect
-- transactions at a few hundred per second. The insert trigger now raises at
-- most one notification per queue per 10 ms, without ever waiting: the
-- transaction that takes the queue's row (SKIP LOCKED) notifies, the others
-- skip. Workers that were woken keep polling briefly (the engine's active
-- poll), which picks up the effects of the transactions that skipped.
CREATE UNLOGGED TABLE pgoutbox.notify_state (
    queue        text PRIMARY KEY,
    notified_at  timestamptz NOT NULL
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        -- Never wait: a transaction holding the queue's notifier lock will
        -- notify at its commit, so the others skip.
        IF pg_try_advisory_xact_lock(hashtextextended('pgoutbox.notify.' || q, 0)) THEN
            INSERT INTO pgoutbox.notify_state AS s (queue, notified_at) VALUES (q, clock_timestamp())
            ON CONFLICT (queue) DO UPDATE SET notified_at = excluded.notified_at
                WHERE s.notified_at < clock_timestamp() - interval '10 milliseconds';
            IF FOUND THEN
                PERFORM pg_notify('pgoutbox_effects', q);
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        PERFORM pg_notify('pgoutbox_effects', q);
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
DROP TABLE pgoutbox.notify_state;
