-- +goose Up
-- Batch storage (docs/batch-storage.md, issue 32): a queue whose storage is
-- 'batch' appends its effects to pgoutbox.stream, an append-only table in
-- three generations (list partitions) that are emptied by TRUNCATE, never
-- vacuumed row by row. A consumer leases a batch (the rows committed between
-- two ticks, decided by snapshots, not by ids) under a fenced token, delivers
-- it, and settles it with one fenced update per page; only the exceptions
-- (retries, dead letters, effects that must not run from a batch) are moved
-- into pgoutbox.effects, where the row-per-effect code handles them.

-- Each queue's storage, written by the Clients that claim it
-- (QueueConfig.Storage); a queue without a row uses 'rows'.
CREATE TABLE pgoutbox.queue_storage (
    queue     text PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 128),
    storage   text NOT NULL CHECK (storage IN ('rows', 'batch')),
    chosen_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgoutbox.queue_storage IS
    'Storage of each queue (rows: one row per effect; batch: pgoutbox.stream), written by the Clients that claim it.';

-- The three generations: exactly one is current (new rows go there), a
-- closed one waits until every batch that can hold its rows is settled, an
-- empty one was truncated and is the next to become current.
CREATE TABLE pgoutbox.stream_generations (
    gen        smallint PRIMARY KEY CHECK (gen BETWEEN 0 AND 2),
    state      text NOT NULL CHECK (state IN ('current', 'closed', 'empty')),
    opened_at  timestamptz,
    closed_at  timestamptz,
    -- The closing transaction's id: a batch whose snapshot sees it
    -- committed was ticked after the close, so it covers every row of the
    -- generation (no writer can still add one, see stream_gen).
    closed_xid xid8,
    CHECK ((state = 'closed') = (closed_xid IS NOT NULL))
);
CREATE UNIQUE INDEX stream_generations_one_current ON pgoutbox.stream_generations (state) WHERE state = 'current';
INSERT INTO pgoutbox.stream_generations (gen, state, opened_at) VALUES (0, 'current', now()), (1, 'empty', NULL),
    (2, 'empty', NULL);

-- The stream: one row per effect of a batch queue, never updated. ids come
-- from the effects' sequence, so an id names one effect in either storage.
-- xid is the inserting transaction's id, which the ticks' snapshots sort
-- into batches in commit order.
CREATE TABLE pgoutbox.stream (
    gen             smallint NOT NULL,
    id              bigint NOT NULL,
    xid             xid8 NOT NULL DEFAULT pg_current_xact_id(),
    queue           text NOT NULL CHECK (queue <> '' AND length(queue) <= 128),
    effect_type     text NOT NULL CHECK (effect_type <> '' AND length(effect_type) <= 128),
    idempotency_key text NOT NULL CHECK (idempotency_key <> '' AND length(idempotency_key) <= 512),
    payload         jsonb NOT NULL DEFAULT '{}' CONSTRAINT stream_payload_size CHECK (octet_length(payload::text) <= 65536),
    max_attempts    integer NOT NULL DEFAULT 8 CHECK (max_attempts BETWEEN 1 AND 1000),
    available_at    timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    ordering_key    text CHECK (ordering_key <> '' AND octet_length(ordering_key) <= 512),
    traceparent     text
) PARTITION BY LIST (gen);
CREATE TABLE pgoutbox.stream_0 PARTITION OF pgoutbox.stream FOR VALUES IN (0);
CREATE TABLE pgoutbox.stream_1 PARTITION OF pgoutbox.stream FOR VALUES IN (1);
CREATE TABLE pgoutbox.stream_2 PARTITION OF pgoutbox.stream FOR VALUES IN (2);
-- A tick's range scan (the rows committed after the previous tick).
CREATE INDEX stream_xid_idx ON pgoutbox.stream (queue, xid);
-- A batch's pages, in id order, and an effect by its id.
CREATE INDEX stream_id_idx ON pgoutbox.stream (id);
COMMENT ON TABLE pgoutbox.stream IS
    'Effects of batch-storage queues, append-only, in three generations emptied by TRUNCATE (docs/batch-storage.md).';

-- One row per batch: the rows of its queue committed in snap and not in
-- prev_snap (the previous batch's snap), ids between min_id and max_id.
-- Leased by one consumer at a time under lease_token; done_through is the
-- last id settled; done_at is set when the last page is settled.
CREATE TABLE pgoutbox.stream_batches (
    queue            text NOT NULL,
    id               bigint NOT NULL,
    snap             pg_snapshot NOT NULL,
    prev_snap        pg_snapshot,
    min_id           bigint NOT NULL,
    max_id           bigint NOT NULL,
    effects          bigint NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    lease_token      uuid,
    lease_owner      text CHECK (length(lease_owner) <= 256),
    lease_expires_at timestamptz,
    done_through     bigint NOT NULL,
    done_at          timestamptz,
    PRIMARY KEY (queue, id)
);
CREATE INDEX stream_batches_open_idx ON pgoutbox.stream_batches (queue, id) WHERE done_at IS NULL;
COMMENT ON TABLE pgoutbox.stream_batches IS
    'Batches of the stream per queue, in tick order: snapshots, fenced lease, settled position (docs/batch-storage.md).';

-- Every effect's state in either storage (docs/batch-storage.md "What
-- stays the same"): the rows of pgoutbox.effects as they are, and each
-- stream effect that was not moved out: completed once its batch settled
-- it (completed_at: the batch's end, NULL while the batch is open),
-- leased while its batch is leased, else available; attempts 1 once
-- delivered. A stream effect's batch is the first kept batch that holds it
-- (committed in its snapshot and not in the previous one), or a settled
-- one that sees it (settled batches but the newest are forgotten).
CREATE VIEW pgoutbox.effect_states AS
SELECT e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.state, e.attempts, e.max_attempts,
    e.available_at, e.created_at, e.lease_token, e.lease_expires_at, e.delivery_started_at, e.completed_at,
    e.last_error, e.ordering_key, 'rows'::text AS storage
FROM pgoutbox.effects e
UNION ALL
SELECT s.id, s.queue, s.effect_type, s.idempotency_key, s.payload, st.state,
    CASE WHEN st.state = 'available' THEN 0 ELSE 1 END, s.max_attempts, s.available_at, s.created_at,
    CASE WHEN st.state = 'leased' THEN b.lease_token END, CASE WHEN st.state = 'leased' THEN b.lease_expires_at END,
    NULL::timestamptz, CASE WHEN st.state = 'completed' THEN b.done_at END, NULL::text, s.ordering_key,
    'batch'::text
FROM pgoutbox.stream s
LEFT JOIN LATERAL (
    SELECT b.* FROM pgoutbox.stream_batches b
    WHERE b.queue = s.queue AND pg_visible_in_snapshot(s.xid, b.snap)
      AND (b.done_at IS NOT NULL OR b.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, b.prev_snap))
    ORDER BY b.id LIMIT 1
) b ON true
CROSS JOIN LATERAL (
    SELECT (CASE
        WHEN b.done_at IS NOT NULL OR b.done_through >= s.id THEN 'completed'
        WHEN b.lease_token IS NOT NULL AND b.lease_expires_at > now() THEN 'leased'
        ELSE 'available'
    END)::pgoutbox.effect_state AS state
) st
LEFT JOIN LATERAL (SELECT true AS moved FROM pgoutbox.effects m WHERE m.id = s.id LIMIT 1) mv ON true
WHERE mv.moved IS NULL;
COMMENT ON VIEW pgoutbox.effect_states IS
    'Every effect in either storage with its state (docs/batch-storage.md).';

-- +goose StatementBegin
-- stream_after is the stream rows of p_queue whose transaction had not
-- committed in p_snap (NULL: every row): its xid is at or past p_snap's
-- xmax, or was in progress then. One range scan of stream_xid_idx and one
-- probe per xid in progress; rows not committed yet are not visible to
-- the caller's snapshot either.
CREATE FUNCTION pgoutbox.stream_after(p_queue text, p_snap pg_snapshot) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    AS $$
    SELECT r.* FROM pgoutbox.stream r
    WHERE r.queue = p_queue AND r.xid >= coalesce(pg_snapshot_xmax(p_snap), '1'::xid8)
    UNION ALL
    SELECT r.* FROM pgoutbox.stream r
    WHERE p_snap IS NOT NULL AND r.queue = p_queue AND r.xid = ANY (ARRAY(SELECT pg_snapshot_xip(p_snap)))
$$;
-- +goose StatementEnd

-- The stream effects still to deliver, per batch queue, for `status`, the
-- console and /metrics (store.Stats): the rows committed after the queue's
-- newest settled batch (stream_after), less those an open batch settled
-- already; leased while the open batch that holds them is leased, else
-- available. An effect moved to pgoutbox.effects was moved by the settle
-- that passed it, so it is not among them. Per row, a test against the
-- queue's few open batches, no probe.
CREATE VIEW pgoutbox.stream_pending AS
SELECT s.id, q.queue, s.effect_type, s.available_at, s.created_at,
    (CASE WHEN o.lease_token IS NOT NULL AND o.lease_expires_at > now() THEN 'leased' ELSE 'available' END
    )::pgoutbox.effect_state AS state
FROM pgoutbox.queue_storage q
LEFT JOIN LATERAL (
    SELECT d.snap FROM pgoutbox.stream_batches d
    WHERE d.queue = q.queue AND d.done_at IS NOT NULL ORDER BY d.id DESC LIMIT 1
) last ON true
CROSS JOIN LATERAL pgoutbox.stream_after(q.queue, last.snap) s
LEFT JOIN pgoutbox.stream_batches o
    ON o.queue = q.queue AND o.done_at IS NULL AND s.id BETWEEN o.min_id AND o.max_id
   AND pg_visible_in_snapshot(s.xid, o.snap)
   AND (o.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, o.prev_snap))
WHERE NOT coalesce(o.done_through >= s.id, false);
COMMENT ON VIEW pgoutbox.stream_pending IS
    'Stream effects still to deliver, available or leased (docs/batch-storage.md).';

-- +goose StatementBegin
-- stream_gen is the generation a new stream row goes to. Under READ
-- COMMITTED it first takes the stream's shared lock until the transaction
-- ends, then reads the current generation in a fresh snapshot: a rotation
-- (stream_maintain) takes the lock exclusively, so it waits until every
-- transaction that may still write to the closing generation has ended, and
-- none that reads after it can pick the closed one. Under REPEATABLE READ or
-- SERIALIZABLE the snapshot is the transaction's, which may predate a
-- rotation: the row lock then raises serialization_failure when the
-- generation was rotated since, and the caller retries.
CREATE FUNCTION pgoutbox.stream_gen() RETURNS smallint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_gen smallint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('pgoutbox.stream', 0));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT g.gen INTO v_gen FROM pgoutbox.stream_generations g WHERE g.state = 'current';
    ELSE
        SELECT g.gen INTO v_gen FROM pgoutbox.stream_generations g WHERE g.state = 'current' FOR KEY SHARE;
    END IF;
    IF v_gen IS NULL THEN
        RAISE EXCEPTION 'pgoutbox: the stream generation changed under this transaction'
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN v_gen;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- effects_to_stream sends an INSERT into pgoutbox.effects of a new effect
-- of a batch queue to the stream instead (the SQL API, the TypeScript
-- client, any other writer). Any row that is not a fresh available effect
-- stays. The engine's own statements (the Go enqueue, which writes a batch
-- queue's rows to the stream itself, and a page's settle moving effects
-- out of it) say they routed their rows in pgoutbox.routed, which the
-- trigger's WHEN reads, so they pay no PL/pgSQL call per row;
-- effect_keys_insert, at the end of the statement, resets it.
CREATE FUNCTION pgoutbox.effects_to_stream() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    IF NEW.state <> 'available' OR NEW.attempts <> 0
       OR NOT EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = NEW.queue AND s.storage = 'batch') THEN
        RETURN NEW;
    END IF;
    -- The statement's AFTER trigger writes key rows only for the rows that
    -- stayed: a writer that did not write its key rows itself gets this
    -- one's here (a taken key raises unique_violation, as it would there).
    IF current_setting('pgoutbox.keys_written', true) IS DISTINCT FROM 'on' THEN
        INSERT INTO pgoutbox.effect_keys (queue, idempotency_key, effect_id)
        VALUES (NEW.queue, NEW.idempotency_key, NEW.id);
    END IF;
    INSERT INTO pgoutbox.stream (gen, id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
        created_at, ordering_key, traceparent)
    VALUES (pgoutbox.stream_gen(), NEW.id, NEW.queue, NEW.effect_type, NEW.idempotency_key, NEW.payload,
        NEW.max_attempts, NEW.available_at, NEW.created_at, NEW.ordering_key, NEW.traceparent);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER effects_to_stream BEFORE INSERT ON pgoutbox.effects
    FOR EACH ROW WHEN (current_setting('pgoutbox.routed', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION pgoutbox.effects_to_stream();

-- +goose StatementBegin
-- effect_keys_insert (migration 00006), which also ends the statement's
-- pgoutbox.routed.
CREATE OR REPLACE FUNCTION pgoutbox.effect_keys_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pgoutbox.routed', true) = 'on' THEN
        PERFORM set_config('pgoutbox.routed', 'off', true);
    END IF;
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

-- +goose StatementBegin
-- notify_stream wakes the queue's consumers as notify_effects does for
-- pgoutbox.effects (the same limiter, migration 00005). effects_to_stream
-- inserts one row per statement, so this fires once per effect of a
-- multi-row INSERT into pgoutbox.effects: it writes the backend's
-- notify_pending row only when the transaction last named another queue
-- there (pgoutbox.stream_notified). Rewriting one row once per effect in a
-- transaction made each rewrite walk the row's versions so far: 300,000
-- effects in one INSERT through the trigger had not finished after 17
-- minutes.
CREATE FUNCTION pgoutbox.notify_stream() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_rows n LOOP
        IF current_setting('pgoutbox.stream_notified', true) IS DISTINCT FROM q THEN
            INSERT INTO pgoutbox.notify_pending AS p (pid, queue) VALUES (pg_backend_pid(), q)
            ON CONFLICT (pid) DO UPDATE SET queue = excluded.queue;
            PERFORM set_config('pgoutbox.stream_notified', q, true);
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER stream_notify_insert AFTER INSERT ON pgoutbox.stream
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.notify_stream();

-- +goose StatementBegin
-- stream_tick closes the next batch of a queue: when rows were committed
-- since the previous batch's snapshot, it records the current snapshot as
-- a new batch (with the range of its ids) and returns its id, else NULL.
-- One tick per queue at a time (a transaction-level advisory lock); it
-- must run under READ COMMITTED, where each statement below takes a fresh
-- snapshot after the lock.
CREATE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_min   bigint;
    v_max   bigint;
    v_count bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    SELECT min(s.id), max(s.id), count(*) INTO v_min, v_max, v_count
    FROM pgoutbox.stream_after(p_queue, v_prev) s
    WHERE pg_visible_in_snapshot(s.xid, v_snap);
    IF v_count = 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through)
    VALUES (p_queue, coalesce(v_last, 0) + 1, v_snap, v_prev, v_min, v_max, v_count, v_min - 1);
    RETURN coalesce(v_last, 0) + 1;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
-- stream_maintain empties and rotates the generations, and forgets settled
-- batches. A closed generation is truncated once it has been closed for
-- p_retention and every queue with rows in it has settled a batch ticked
-- after the close. The current generation is closed once it is older than
-- p_rotate_after, holds rows, and the next one is empty: under the
-- stream's exclusive lock, waited for at most 200 ms (stream_gen), so a
-- rotation never closes a generation a running transaction may still write
-- to. Returns the number of generations truncated.
CREATE FUNCTION pgoutbox.stream_maintain(p_rotate_after interval, p_retention interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    g         record;
    v_cur     record;
    v_settled boolean;
    v_n       integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('pgoutbox.stream_maintain', 0)) THEN
        RETURN 0; -- another process maintains the stream right now
    END IF;
    FOR g IN SELECT * FROM pgoutbox.stream_generations
             WHERE state = 'closed' AND closed_at <= now() - p_retention ORDER BY closed_at LOOP
        SELECT bool_and(NOT EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = g.gen AND s.queue = q.queue)
                        OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches b
                                   WHERE b.queue = q.queue AND b.done_at IS NOT NULL
                                     AND pg_visible_in_snapshot(g.closed_xid, b.snap)))
        INTO v_settled
        FROM pgoutbox.queue_storage q;
        IF coalesce(v_settled, true) THEN
            BEGIN
                PERFORM set_config('lock_timeout', '500ms', true);
                EXECUTE format('TRUNCATE pgoutbox.%I', 'stream_' || g.gen);
                UPDATE pgoutbox.stream_generations
                SET state = 'empty', opened_at = NULL, closed_at = NULL, closed_xid = NULL
                WHERE gen = g.gen;
                v_n := v_n + 1;
            EXCEPTION WHEN lock_not_available THEN
                NULL; -- a reader holds it: the next call tries again
            END;
        END IF;
    END LOOP;

    SELECT * INTO v_cur FROM pgoutbox.stream_generations WHERE state = 'current';
    IF v_cur.opened_at <= now() - p_rotate_after
       AND EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.gen = v_cur.gen)
       AND (SELECT state FROM pgoutbox.stream_generations WHERE gen = (v_cur.gen + 1) % 3) = 'empty' THEN
        BEGIN
            PERFORM set_config('lock_timeout', '200ms', true);
            PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream', 0));
            UPDATE pgoutbox.stream_generations
            SET state = 'closed', closed_at = now(), closed_xid = pg_current_xact_id()
            WHERE gen = v_cur.gen AND state = 'current';
            UPDATE pgoutbox.stream_generations SET state = 'current', opened_at = now()
            WHERE gen = (v_cur.gen + 1) % 3;
        EXCEPTION WHEN lock_not_available THEN
            NULL; -- an enqueue is still open: the next call tries again
        END;
    END IF;

    -- Settled batches but each queue's newest: that one's snapshot is the
    -- next tick's lower bound.
    DELETE FROM pgoutbox.stream_batches b
    WHERE b.done_at IS NOT NULL
      AND b.id < (SELECT max(l.id) FROM pgoutbox.stream_batches l WHERE l.queue = b.queue AND l.done_at IS NOT NULL);
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.effect_keys_insert() RETURNS trigger
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
DROP VIEW pgoutbox.stream_pending;
DROP FUNCTION pgoutbox.stream_after(text, pg_snapshot);
DROP VIEW pgoutbox.effect_states;
DROP FUNCTION pgoutbox.stream_maintain(interval, interval);
DROP FUNCTION pgoutbox.stream_tick(text);
DROP TRIGGER stream_notify_insert ON pgoutbox.stream;
DROP FUNCTION pgoutbox.notify_stream();
DROP TRIGGER effects_to_stream ON pgoutbox.effects;
DROP FUNCTION pgoutbox.effects_to_stream();
DROP FUNCTION pgoutbox.stream_gen();
DROP TABLE pgoutbox.stream_batches;
DROP TABLE pgoutbox.stream;
DROP TABLE pgoutbox.stream_generations;
DROP TABLE pgoutbox.queue_storage;
