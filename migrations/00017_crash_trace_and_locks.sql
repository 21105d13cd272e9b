-- +goose Up
-- Two changes (issue 28).
--
-- 1. Row-lock claims leave a durable record (docs/design.md "Row-lock
-- leases"). A row-lock batch (QueueConfig.RowLockLease) writes nothing to
-- the effects it holds until it closes, so a worker that dies during the
-- hold counts no attempt. Until now the only trace of such a crash was the
-- dead claimer's lock in each row's xmax, which VACUUM (FREEZE), and plain
-- (auto)vacuum with vacuum_freeze_min_age = 0 or PostgreSQL 16's
-- opportunistic freezing, erases: a poison effect that kills its worker
-- was then delivered uncounted forever.
--
-- Now a batch records the ids it locked, one row per batch, committed on
-- its own (asynchronous commit: a worker's crash does not lose it, a
-- server crash may) before any of them is delivered, and deletes the row
-- in the transaction that closes the batch. A row that an available effect
-- shares with an unclosed batch that no longer holds its lock was claimed
-- by a batch that died: the next claim delivers that effect under a
-- durable lease, which counts the attempt. store.PruneLockClaims deletes
-- the records of dead batches whose effects have all moved on.
--
-- Only the engine's owner reads or writes the table: a role without
-- privileges on it cannot forge or erase a record.
CREATE TABLE pgoutbox.lock_claims (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue       text NOT NULL,
    effect_ids  bigint[] NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT now()
);
REVOKE ALL ON pgoutbox.lock_claims FROM PUBLIC;
COMMENT ON TABLE pgoutbox.lock_claims IS
    'The effects each open row-lock batch holds; a record left by a batch that never closed marks its effects as attempted (docs/design.md "Row-lock leases").';

-- 2. The NOTIFY limiter and the ordering locks take row locks on tables only
-- the engine's owner may lock, inside SECURITY DEFINER code, instead of
-- advisory locks: any role may take an advisory lock, at session level,
-- and one held lock silenced a queue's notifications or made every
-- ordered enqueue of its stripe wait, inside the producers' business
-- transactions, until their statement_timeout.
REVOKE ALL ON pgoutbox.notify_state FROM PUBLIC;
REVOKE ALL ON pgoutbox.notify_pending FROM PUBLIC;

-- The limiter's commit-time trigger (00011), redefined. It skips the
-- notification when
--   * a notification for the queue was committed in the last 10 ms (the
--     workers it woke poll the queue for 250 ms, ActiveTail); or
--   * another transaction holds the queue's notify_state row, and a
--     notification for the queue was committed in the last 20 ms: the
--     holder is committing and notifies within its commit, or, if it is
--     not committing, the workers woken 20 ms ago still poll.
-- Otherwise it takes the row without waiting, records the time and
-- notifies; when it cannot take it (a holder trusted for no longer) it
-- notifies without recording. No transaction can silence a queue for
-- more than 20 ms: one that took the row and did not commit (it ran SET
-- CONSTRAINTS ALL IMMEDIATE after its enqueue) only costs the queue its
-- rate limit while it stays open.
--
-- Fired at its insert (SET CONSTRAINTS ALL IMMEDIATE before the enqueue:
-- the constraint trigger runs inside the insert trigger's statement,
-- pg_trigger_depth() > 1), the transaction is not committing: it takes
-- nothing, decides nothing, and notifies at its commit.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    q       text := NEW.queue;
    v_saved text;
BEGIN
    IF pg_trigger_depth() > 1 OR current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify('pgoutbox_effects', q);
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM pgoutbox.notify_state s
               WHERE s.queue = q AND s.notified_at > clock_timestamp() - interval '10 milliseconds') THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM pgoutbox.notify_state s WHERE s.queue = q FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        UPDATE pgoutbox.notify_state s SET notified_at = clock_timestamp() WHERE s.queue = q;
    ELSIF EXISTS (SELECT 1 FROM pgoutbox.notify_state s WHERE s.queue = q) THEN
        IF EXISTS (SELECT 1 FROM pgoutbox.notify_state s
                   WHERE s.queue = q AND s.notified_at > clock_timestamp() - interval '20 milliseconds') THEN
            RETURN NULL;
        END IF;
    ELSE
        -- The queue's first notification. Never wait for another
        -- transaction inserting the same row: it notifies too.
        v_saved := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '1ms', true);
            INSERT INTO pgoutbox.notify_state (queue, notified_at) VALUES (q, clock_timestamp())
            ON CONFLICT (queue) DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', v_saved, true);
    END IF;
    PERFORM pg_notify('pgoutbox_effects', q);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- The ordering locks (00013), redefined: one row lock per stripe of
-- ordering_stripes, 1,024 stripes shared by every queue (a (queue, key)
-- pair's stripe: a hash of the key seeded with a hash of the queue),
-- taken in stripe order (no deadlock between two batches), held until the
-- transaction ends. Two transactions enqueuing to one key wait for each
-- other, so the key's ids follow the commit order of their transactions;
-- keys that share a stripe only wait for each other. A batch takes at most
-- 1,024 locks however many keys it enqueues.
-- A lock writes the row's header: fillfactor 10 spreads the stripes over
-- about 50 pages, so concurrent enqueuers rarely lock the same page.
CREATE TABLE pgoutbox.ordering_stripes (
    stripe integer PRIMARY KEY CHECK (stripe BETWEEN 0 AND 1023)
) WITH (fillfactor = 10);
INSERT INTO pgoutbox.ordering_stripes (stripe) SELECT generate_series(0, 1023);
REVOKE ALL ON pgoutbox.ordering_stripes FROM PUBLIC;
COMMENT ON TABLE pgoutbox.ordering_stripes IS
    'The ordering locks: an enqueue locks the rows of its (queue, ordering key) stripes until it commits (docs/design.md "Per-key ordering").';

-- ordering_lock runs as its owner, for a caller that may enqueue: one
-- that may insert effects (Go's store.Insert) or a member of
-- pgoutbox_enqueuer (pgoutbox.enqueue and enqueue_batch call it as their
-- owner, for that role). The caller is the session's role (SET ROLE) or
-- its user: a security-definer function cannot change it. Any other
-- role is refused, and takes no lock.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.ordering_lock(p_queues text[], p_ordering_keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role    text := current_setting('role');
    v_stripes integer[];
    v_n       bigint;
BEGIN
    IF v_role = 'none' THEN
        v_role := session_user;
    END IF;
    IF NOT has_table_privilege(v_role, 'pgoutbox.effects', 'INSERT') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = 'pgoutbox_enqueuer') THEN
            RAISE EXCEPTION 'pgoutbox: role % may not take ordering locks: it may not enqueue', v_role
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF NOT pg_has_role(v_role, 'pgoutbox_enqueuer', 'MEMBER') THEN
            RAISE EXCEPTION 'pgoutbox: role % may not take ordering locks: it may not enqueue', v_role
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    SELECT array_agg(DISTINCT (hashtextextended(t.k, hashtextextended(t.q, 0)) & 1023)::integer)
    INTO v_stripes
    FROM unnest(p_queues, p_ordering_keys) AS t(q, k)
    WHERE t.k IS NOT NULL;
    IF v_stripes IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_n FROM (
        SELECT 1 FROM pgoutbox.ordering_stripes s
        WHERE s.stripe = ANY(v_stripes)
        ORDER BY s.stripe
        FOR UPDATE
    ) l;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.ordering_lock(p_queues text[], p_ordering_keys text[]) RETURNS void
LANGUAGE sql VOLATILE SECURITY INVOKER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT count(pg_advisory_xact_lock(s.q, s.stripe))
    FROM (
        SELECT DISTINCT hashtext('pgoutbox.ordering:' || t.q) AS q, (hashtextextended(t.k, 0) & 255)::integer AS stripe
        FROM unnest(p_queues, p_ordering_keys) AS t(q, k)
        WHERE t.k IS NOT NULL
        ORDER BY 1, 2
    ) s;
    SELECT NULL::void;
$$;
-- +goose StatementEnd
DROP TABLE pgoutbox.ordering_stripes;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.notify_at_commit() RETURNS trigger
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

DROP TABLE pgoutbox.lock_claims;
