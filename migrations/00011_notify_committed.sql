-- +goose Up
-- The NOTIFY limiter of 00005 decided at insert time: the producer
-- transaction that took the queue's notifier lock (a tried advisory
-- transaction lock) notified at its commit, and every other producer of the
-- queue skipped while it stayed open. A producer left open after its insert
-- (slow application work after the enqueue) or rolled back thereby delayed
-- the wake-up of effects that other producers had committed meanwhile,
-- until it ended or the workers' poll interval (1 s) passed.
--
-- Now the decision is taken at commit. The insert trigger only marks the
-- transaction (its backend's row of notify_pending, a HOT update), which
-- queues a deferred constraint trigger; at commit that trigger skips the
-- notification when
--   * a notification for the queue was committed in the last 10 ms: the
--     workers it woke poll the queue every 5 ms for 250 ms (the engine's
--     ActivePollInterval and ActiveTail) and find this effect; or
--   * another transaction holds the queue's notifier lock, which is taken
--     only while committing: that transaction notifies within its commit.
-- Otherwise it takes the lock without waiting, notifies, and records the
-- time in notify_state. An open transaction never silences another one: it
-- takes nothing until it commits, and what it wrote is invisible to the
-- others. Outside READ COMMITTED the transaction notifies without reading
-- or writing notify_state (an older snapshot would only make it notify
-- more; a write could fail with a serialization error at commit).
--
-- Both trigger functions are SECURITY DEFINER: the commit-time trigger runs
-- as whoever commits, which for the SQL API (00008) is pgoutbox_enqueuer,
-- outside the definer's enqueue function; and a role allowed to insert
-- effects needs no rights on the limiter's tables.
DROP TABLE pgoutbox.notify_state;
CREATE UNLOGGED TABLE pgoutbox.notify_state (
    queue        text PRIMARY KEY,
    notified_at  timestamptz NOT NULL
);
-- One row per backend that enqueued, rewritten (HOT) by each of its
-- transactions: only its own backend writes a row, so nothing waits.
CREATE UNLOGGED TABLE pgoutbox.notify_pending (
    pid    integer PRIMARY KEY,
    queue  text NOT NULL
) WITH (fillfactor = 50);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        INSERT INTO pgoutbox.notify_pending AS p (pid, queue) VALUES (pg_backend_pid(), q)
        ON CONFLICT (pid) DO UPDATE SET queue = excluded.queue;
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.notify_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q text := NEW.queue;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('pgoutbox_effects', q);
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgoutbox.notify_state s
               WHERE s.queue = q AND s.notified_at > clock_timestamp() - interval '10 milliseconds')
       OR NOT pg_try_advisory_xact_lock(hashtextextended('pgoutbox.notify.' || q, 0)) THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgoutbox.notify_state AS s (queue, notified_at) VALUES (q, clock_timestamp())
    ON CONFLICT (queue) DO UPDATE SET notified_at = excluded.notified_at;
    PERFORM pg_notify('pgoutbox_effects', q);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER notify_pending_at_commit
    AFTER INSERT OR UPDATE ON pgoutbox.notify_pending
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION pgoutbox.notify_at_commit();

-- +goose Down
DROP TABLE pgoutbox.notify_pending;
DROP FUNCTION pgoutbox.notify_at_commit();
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
