-- +goose Up
-- The NOTIFY limiter of 00005 let the transaction holding a queue's notifier
-- lock (a tried advisory transaction lock) silence every other producer of
-- the queue until it ended: a producer transaction left open (an insert
-- followed by slow application work) or rolled back delayed the wake-up of
-- effects that other producers had committed meanwhile, until the lock
-- holder committed or the workers' poll interval (1 s) passed.
--
-- Now a producer skips its notification only when a notification for the
-- queue was COMMITTED within the last 10 ms: the workers it woke poll the
-- queue every 5 ms for 250 ms (ActivePollInterval, ActiveTail), so they find
-- the skipped effects. The evidence is a committed row of notify_state;
-- what an open transaction wrote is invisible to the others and never
-- suppresses anything. A producer that notifies records its time in one of
-- a few slots per queue, the first whose advisory lock it can take without
-- waiting (one writer per slot, so no producer ever waits on another); when
-- every slot is held by an open transaction it notifies without recording.
-- PostgreSQL folds identical notifications of one transaction, and a
-- transaction sees its own recorded time, so a transaction notifies a queue
-- at most once however many statements insert into it.
DROP TABLE pgoutbox.notify_state;
CREATE UNLOGGED TABLE pgoutbox.notify_state (
    queue        text NOT NULL,
    slot         smallint NOT NULL,
    notified_at  timestamptz NOT NULL,
    PRIMARY KEY (queue, slot)
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
    k int;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pgoutbox.notify_state s
            WHERE s.queue = q AND s.notified_at > clock_timestamp() - interval '10 milliseconds');
        PERFORM pg_notify('pgoutbox_effects', q);
        FOR k IN 0..3 LOOP
            IF pg_try_advisory_xact_lock(hashtextextended('pgoutbox.notify.' || q, k)) THEN
                INSERT INTO pgoutbox.notify_state AS s (queue, slot, notified_at)
                VALUES (q, k, clock_timestamp())
                ON CONFLICT (queue, slot) DO UPDATE SET notified_at = excluded.notified_at;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE pgoutbox.notify_state;
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
