-- +goose Up
-- Per-key ordering (issue 22, docs/design.md "Per-key ordering"). Within a
-- queue, the effects that share an ordering key are delivered one at a
-- time, in the order their enqueuing transactions committed.
--
--   * effects.ordering_key: NULL (the default: no ordering) or 1-512 bytes.
--     It cannot be changed once written (like the queue and the key).
--   * The enqueue (Go's store.Insert, pgoutbox.enqueue_rows) takes a
--     transaction-level advisory lock on (queue, ordering key) (one of 256
--     stripes per queue: ordering_lock) before it draws the effect's id:
--     two transactions enqueuing to one key wait for each other, so the
--     key's ids follow the commit order of their transactions. Effects
--     without a key take no lock.
--   * The claim skips an effect while an earlier effect (lower id) of its
--     queue and key is not terminal: available (due, retrying or
--     scheduled), leased, reconciliation_required, or dead_letter unless
--     the dead letter's type lets its key move on (ordering_types).
--     effects_ordering_idx answers that question with one index probe; it
--     holds only ordered effects that are not completed, so unordered
--     effects write nothing to it.
--   * pgoutbox.ordering_types records, per effect type, whether a dead
--     letter lets its key move on; a Client writes its registered types
--     (EffectType.OrderingMovesOn) when it starts. No row: strict.
--   * When an ordered effect is completed or dead-lettered, its queue is
--     notified, so the claimers pick up the key's next effect at once
--     instead of at their next poll.
ALTER TABLE pgoutbox.effects ADD COLUMN ordering_key text
    CONSTRAINT effects_ordering_key_check CHECK (ordering_key <> '' AND octet_length(ordering_key) <= 512);

CREATE INDEX effects_ordering_idx ON pgoutbox.effects (queue, ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state <> 'completed';

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.ordering_key_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.ordering_key IS DISTINCT FROM OLD.ordering_key THEN
        RAISE EXCEPTION 'pgoutbox: the ordering key of effect % cannot be changed', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'effects_ordering_key_immutable';
    END IF;
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER effects_ordering_key_immutable
    BEFORE UPDATE OF ordering_key ON pgoutbox.effects
    FOR EACH ROW EXECUTE FUNCTION pgoutbox.ordering_key_immutable();

CREATE TABLE pgoutbox.ordering_types (
    effect_type           text PRIMARY KEY CHECK (effect_type <> '' AND length(effect_type) <= 128),
    dead_letter_moves_on  boolean NOT NULL DEFAULT false,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE pgoutbox.ordering_types IS
    'Per effect type: does a dead letter let its ordering key move on (true) or block it until replayed (false, the default when absent)? Written by pgoutbox Clients at start from EffectType.OrderingMovesOn.';

-- ordering_lock takes, in one canonical order, the transaction-level
-- advisory locks of the (queue, ordering key) pairs among the arrays whose
-- key is not NULL. A key's lock is one of 256 stripes of its queue
-- (classid: a hash of the queue; objid: a hash of the key, modulo 256), so
-- a transaction holds at most 256 ordering locks per queue however many
-- keys it enqueues: one lock per key overflowed the server's lock table
-- (max_locks_per_transaction) for a batch of 20,000 keys. Keys that share
-- a stripe only wait for each other.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.ordering_lock(p_queues text[], p_ordering_keys text[]) RETURNS void
LANGUAGE sql VOLATILE
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

-- +goose StatementBegin
CREATE FUNCTION pgoutbox.notify_ordered() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- Identical notifications of one transaction are folded into one.
    PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- A row trigger whose WHEN is false for unordered effects: their updates
-- queue no trigger event.
CREATE TRIGGER effects_ordered_notify
    AFTER UPDATE OF state ON pgoutbox.effects
    FOR EACH ROW
    WHEN (NEW.ordering_key IS NOT NULL AND NEW.state IN ('completed', 'dead_letter') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION pgoutbox.notify_ordered();

DROP FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval);
DROP FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[]);

-- enqueue_rows validates and writes effects given as parallel arrays, in
-- one statement (the shape of Go's store.Insert), and returns their ids in
-- input order. It is the body of enqueue and enqueue_batch and runs with
-- their (the owner's) privileges; PUBLIC may not call it. Since 00013 it
-- takes the effects' ordering keys (NULL: none) and, before any id is taken,
-- the ordering locks of the batch's (queue, ordering key) pairs.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue_rows(
    p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[],
    p_available_at timestamptz[], p_delays interval[], p_ordering_keys text[]
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Go's unicode.IsSpace: what strings.TrimSpace removes.
    c_blank     constant text := '^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$';
    v_n         integer := coalesce(array_length(p_queues, 1), 0);
    v_payloads  jsonb[] := '{}';
    v_attempts  integer[] := '{}';
    v_at        text;
    v_path      text;
    v_pj        jsonb;
    v_size      integer;
    v_ids       bigint[];
BEGIN
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    FOR i IN 1..v_n LOOP
        v_at := CASE WHEN v_n > 1 THEN format('effect %s: ', i - 1) ELSE '' END;
        IF p_queues[i] IS NULL OR octet_length(p_queues[i]) > 128 OR p_queues[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: queue must be 1-128 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'queue';
        END IF;
        IF p_types[i] IS NULL OR octet_length(p_types[i]) > 128 OR p_types[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: effect_type must be 1-128 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'effect_type';
        END IF;
        IF p_keys[i] IS NULL OR octet_length(p_keys[i]) > 512 OR p_keys[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: idempotency_key must be 1-512 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'idempotency_key';
        END IF;
        IF p_ordering_keys[i] IS NOT NULL AND (octet_length(p_ordering_keys[i]) > 512 OR p_ordering_keys[i] ~ c_blank) THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: ordering_key must be NULL (none) or 1-512 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'ordering_key';
        END IF;
        IF p_max_attempts[i] < 0 OR p_max_attempts[i] > 1000 THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be between 0 (default) and 1000, not %',
                v_at, p_max_attempts[i]
                USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
        END IF;
        IF p_delays[i] < interval '0' THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay must not be negative, not %', v_at, p_delays[i]
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END IF;
        IF p_delays[i] > interval '0' AND p_available_at[i] IS NOT NULL THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay cannot be combined with available_at', v_at
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END IF;
        IF NOT isfinite(p_available_at[i]) THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: available_at must be a finite time, not %', v_at, p_available_at[i]
                USING ERRCODE = 'OB001', COLUMN = 'available_at';
        END IF;
        IF p_payloads[i] IS NULL THEN
            v_pj := '{}';
        ELSE
            v_size := octet_length(p_payloads[i]::text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
            v_path := pgoutbox.credential_key_path(p_payloads[i]);
            IF v_path IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %payload key % looks like a credential; secrets must not be stored in effects',
                    v_at, v_path
                    USING ERRCODE = 'OB003', COLUMN = 'payload';
            END IF;
            v_pj := p_payloads[i]::jsonb;
            -- The stored text (effects_payload_size) can be longer than the
            -- text given: jsonb adds spaces and spells numbers out.
            v_size := octet_length(v_pj::text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes as stored, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
        END IF;
        v_payloads := array_append(v_payloads, v_pj);
        v_attempts := array_append(v_attempts, coalesce(nullif(p_max_attempts[i], 0), 8));
    END LOOP;

    -- The ordering locks (Go's store.Insert, docs/design.md "Per-key
    -- ordering"): one transaction-level advisory lock per (queue, ordering
    -- key) of the batch, taken in one canonical order before any id is
    -- drawn, so the ids of one key's effects follow the commit order of
    -- their transactions.
    PERFORM pgoutbox.ordering_lock(p_queues, p_ordering_keys);

    -- Key rows first, in canonical (queue, key) byte order; ON CONFLICT DO
    -- NOTHING skips a key already present, waiting for a concurrent
    -- transaction that inserted it; only the effects whose key row was
    -- written are inserted, and the insert trigger is told so (00006). The
    -- statement returns, in input order, each created effect's id or NULL.
    WITH input AS (
        SELECT nextval('pgoutbox.effects_id_seq'::regclass) AS id, t.*
        FROM unnest(p_queues, p_types, p_keys, v_payloads, v_attempts, p_available_at, p_delays, p_ordering_keys)
            WITH ORDINALITY AS t(queue, effect_type, idempotency_key, payload, max_attempts, available_at, delay,
                                 ordering_key, ord)
        ORDER BY t.ord
    ), keyed AS (
        INSERT INTO pgoutbox.effect_keys AS x (queue, idempotency_key, effect_id)
        SELECT i.queue, i.idempotency_key, i.id FROM input i
        ORDER BY i.queue COLLATE "C", i.idempotency_key COLLATE "C", i.id
        ON CONFLICT (queue, idempotency_key) DO NOTHING
        RETURNING x.effect_id
    ), marked AS (
        SELECT set_config('pgoutbox.keys_written', 'on', true) AS m
    ), created AS (
        INSERT INTO pgoutbox.effects AS e (id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
                                           ordering_key)
        OVERRIDING SYSTEM VALUE
        SELECT i.id, i.queue, i.effect_type, i.idempotency_key, i.payload, i.max_attempts,
            coalesce(i.available_at, now() + coalesce(i.delay, interval '0')), i.ordering_key
        FROM input i JOIN keyed k ON k.effect_id = i.id CROSS JOIN marked
        ORDER BY i.id
        RETURNING e.id
    )
    SELECT array_agg(c.id ORDER BY i.ord) INTO v_ids
    FROM input i LEFT JOIN created c ON c.id = i.id;

    -- The keys that existed, or repeated in the batch: a fresh statement
    -- also sees a row a concurrent transaction committed while the insert
    -- waited for it.
    IF array_position(v_ids, NULL) IS NOT NULL THEN
        SELECT array_agg(coalesce(v_ids[t.ord], k.effect_id) ORDER BY t.ord) INTO v_ids
        FROM unnest(p_queues, p_keys) WITH ORDINALITY AS t(queue, idempotency_key, ord)
        LEFT JOIN LATERAL (
            SELECT x.effect_id FROM pgoutbox.effect_keys x
            WHERE x.queue = t.queue AND x.idempotency_key = t.idempotency_key
            LIMIT 1
        ) k ON v_ids[t.ord] IS NULL;
        IF array_position(v_ids, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'pgoutbox: an idempotency key conflicts with an effect this transaction cannot see'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    RETURN v_ids;
END;
$$;
-- +goose StatementEnd

-- enqueue writes one effect inside the caller's transaction and returns its
-- id (the existing effect's id when the key is taken in the queue). Since
-- 00013 it takes an ordering_key (NULL: none).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue(
    queue            text,
    effect_type      text,
    idempotency_key  text,
    payload          json DEFAULT NULL,
    max_attempts     integer DEFAULT NULL,
    available_at     timestamptz DEFAULT NULL,
    delay            interval DEFAULT NULL,
    ordering_key     text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (pgoutbox.enqueue_rows(ARRAY[queue], ARRAY[effect_type], ARRAY[idempotency_key], ARRAY[payload],
                                  ARRAY[max_attempts], ARRAY[available_at], ARRAY[delay], ARRAY[ordering_key]))[1];
END;
$$;
-- +goose StatementEnd

-- enqueue_batch writes a JSON array of effects ({"queue", "effect_type",
-- "idempotency_key", "payload", "max_attempts", "available_at", "delay",
-- "ordering_key"}; the last five optional) in one statement and returns one row per element: its
-- index (from 0) and its id. One bad element refuses the whole batch.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.enqueue_batch(effects json) RETURNS TABLE (idx integer, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_fields    constant text[] := ARRAY['queue', 'effect_type', 'idempotency_key', 'payload', 'max_attempts', 'available_at',
                                         'delay', 'ordering_key'];
    v_n         integer;
    v_at        text;
    v_e         json;
    v_f         text;
    v_num       numeric;
    v_queues    text[] := '{}';
    v_types     text[] := '{}';
    v_keys      text[] := '{}';
    v_payloads  json[] := '{}';
    v_attempts  integer[] := '{}';
    v_avail     timestamptz[] := '{}';
    v_delays    interval[] := '{}';
    v_okeys     text[] := '{}';
    v_delay     interval;
    v_ts        timestamptz;
    v_ids       bigint[];
BEGIN
    IF effects IS NULL OR json_typeof(effects) <> 'array' THEN
        RAISE EXCEPTION 'pgoutbox: invalid batch: effects must be a JSON array of effect objects'
            USING ERRCODE = 'OB001';
    END IF;
    v_n := json_array_length(effects);
    FOR i IN 0..v_n - 1 LOOP
        v_e := effects -> i;
        v_at := CASE WHEN v_n > 1 THEN format('effect %s: ', i) ELSE '' END;
        IF json_typeof(v_e) <> 'object' THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: must be a JSON object, not %', v_at, json_typeof(v_e)
                USING ERRCODE = 'OB001';
        END IF;
        SELECT k INTO v_f FROM json_object_keys(v_e) AS k WHERE k <> ALL (c_fields) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: unknown field "%" (the fields are %)', v_at, v_f,
                array_to_string(c_fields, ', ')
                USING ERRCODE = 'OB001', COLUMN = v_f;
        END IF;
        FOREACH v_f IN ARRAY c_fields[1:3] || ARRAY['available_at', 'ordering_key'] LOOP
            IF coalesce(json_typeof(v_e -> v_f), 'null') NOT IN ('string', 'null') THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: % must be a JSON string, not %', v_at, v_f, json_typeof(v_e -> v_f)
                    USING ERRCODE = 'OB001', COLUMN = v_f;
            END IF;
        END LOOP;
        v_queues := array_append(v_queues, v_e ->> 'queue');
        v_types := array_append(v_types, v_e ->> 'effect_type');
        v_keys := array_append(v_keys, v_e ->> 'idempotency_key');
        v_payloads := array_append(v_payloads, v_e -> 'payload');
        CASE coalesce(json_typeof(v_e -> 'max_attempts'), 'null')
        WHEN 'null' THEN
            v_attempts := array_append(v_attempts, NULL);
        WHEN 'number' THEN
            v_num := (v_e ->> 'max_attempts')::numeric;
            IF v_num <> trunc(v_num) OR v_num < 0 OR v_num > 1000 THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be between 0 (default) and 1000, not %',
                    v_at, v_e ->> 'max_attempts'
                    USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
            END IF;
            v_attempts := array_append(v_attempts, v_num::integer);
        ELSE
            RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be a JSON number, not %', v_at,
                json_typeof(v_e -> 'max_attempts')
                USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
        END CASE;
        v_ts := NULL;
        IF v_e ->> 'available_at' IS NOT NULL THEN
            BEGIN
                v_ts := (v_e ->> 'available_at')::timestamptz;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: available_at "%" is not a timestamp (ISO 8601, with a time zone)',
                    v_at, v_e ->> 'available_at'
                    USING ERRCODE = 'OB001', COLUMN = 'available_at';
            END;
        END IF;
        v_avail := array_append(v_avail, v_ts);
        -- delay: a number of seconds, or PostgreSQL interval text ("PT5M",
        -- "5 minutes").
        CASE coalesce(json_typeof(v_e -> 'delay'), 'null')
        WHEN 'null' THEN
            v_delay := NULL;
        WHEN 'number' THEN
            v_delay := make_interval(secs => (v_e ->> 'delay')::float8);
        WHEN 'string' THEN
            BEGIN
                v_delay := (v_e ->> 'delay')::interval;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: delay "%" is not an interval', v_at, v_e ->> 'delay'
                    USING ERRCODE = 'OB001', COLUMN = 'delay';
            END;
        ELSE
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay must be a number of seconds or an interval string, not %',
                v_at, json_typeof(v_e -> 'delay')
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END CASE;
        v_delays := array_append(v_delays, v_delay);
        v_okeys := array_append(v_okeys, v_e ->> 'ordering_key');
    END LOOP;
    v_ids := pgoutbox.enqueue_rows(v_queues, v_types, v_keys, v_payloads, v_attempts, v_avail, v_delays, v_okeys);
    RETURN QUERY SELECT (u.o - 1)::integer, u.x FROM unnest(v_ids) WITH ORDINALITY AS u(x, o) ORDER BY u.o;
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text) FROM PUBLIC;

-- The role of 00008 may call the new enqueue (it lost the dropped one).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_enqueuer') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text) TO pgoutbox_enqueuer;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text);
DROP FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[]);

-- enqueue_rows validates and writes effects given as parallel arrays, in
-- one statement (the shape of Go's store.Insert), and returns their ids in
-- input order. It is the body of enqueue and enqueue_batch and runs with
-- their (the owner's) privileges; PUBLIC may not call it.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue_rows(
    p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[],
    p_available_at timestamptz[], p_delays interval[]
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- Go's unicode.IsSpace: what strings.TrimSpace removes.
    c_blank     constant text := '^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$';
    v_n         integer := coalesce(array_length(p_queues, 1), 0);
    v_payloads  jsonb[] := '{}';
    v_attempts  integer[] := '{}';
    v_at        text;
    v_path      text;
    v_pj        jsonb;
    v_size      integer;
    v_ids       bigint[];
BEGIN
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    FOR i IN 1..v_n LOOP
        v_at := CASE WHEN v_n > 1 THEN format('effect %s: ', i - 1) ELSE '' END;
        IF p_queues[i] IS NULL OR octet_length(p_queues[i]) > 128 OR p_queues[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: queue must be 1-128 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'queue';
        END IF;
        IF p_types[i] IS NULL OR octet_length(p_types[i]) > 128 OR p_types[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: effect_type must be 1-128 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'effect_type';
        END IF;
        IF p_keys[i] IS NULL OR octet_length(p_keys[i]) > 512 OR p_keys[i] ~ c_blank THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: idempotency_key must be 1-512 bytes, not only white space', v_at
                USING ERRCODE = 'OB001', COLUMN = 'idempotency_key';
        END IF;
        IF p_max_attempts[i] < 0 OR p_max_attempts[i] > 1000 THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be between 0 (default) and 1000, not %',
                v_at, p_max_attempts[i]
                USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
        END IF;
        IF p_delays[i] < interval '0' THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay must not be negative, not %', v_at, p_delays[i]
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END IF;
        IF p_delays[i] > interval '0' AND p_available_at[i] IS NOT NULL THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay cannot be combined with available_at', v_at
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END IF;
        IF NOT isfinite(p_available_at[i]) THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: available_at must be a finite time, not %', v_at, p_available_at[i]
                USING ERRCODE = 'OB001', COLUMN = 'available_at';
        END IF;
        IF p_payloads[i] IS NULL THEN
            v_pj := '{}';
        ELSE
            v_size := octet_length(p_payloads[i]::text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
            v_path := pgoutbox.credential_key_path(p_payloads[i]);
            IF v_path IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %payload key % looks like a credential; secrets must not be stored in effects',
                    v_at, v_path
                    USING ERRCODE = 'OB003', COLUMN = 'payload';
            END IF;
            v_pj := p_payloads[i]::jsonb;
            -- The stored text (effects_payload_size) can be longer than the
            -- text given: jsonb adds spaces and spells numbers out.
            v_size := octet_length(v_pj::text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes as stored, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
        END IF;
        v_payloads := array_append(v_payloads, v_pj);
        v_attempts := array_append(v_attempts, coalesce(nullif(p_max_attempts[i], 0), 8));
    END LOOP;

    -- Key rows first, in canonical (queue, key) byte order; ON CONFLICT DO
    -- NOTHING skips a key already present, waiting for a concurrent
    -- transaction that inserted it; only the effects whose key row was
    -- written are inserted, and the insert trigger is told so (00006). The
    -- statement returns, in input order, each created effect's id or NULL.
    WITH input AS (
        SELECT nextval('pgoutbox.effects_id_seq'::regclass) AS id, t.*
        FROM unnest(p_queues, p_types, p_keys, v_payloads, v_attempts, p_available_at, p_delays)
            WITH ORDINALITY AS t(queue, effect_type, idempotency_key, payload, max_attempts, available_at, delay, ord)
        ORDER BY t.ord
    ), keyed AS (
        INSERT INTO pgoutbox.effect_keys AS x (queue, idempotency_key, effect_id)
        SELECT i.queue, i.idempotency_key, i.id FROM input i
        ORDER BY i.queue COLLATE "C", i.idempotency_key COLLATE "C", i.id
        ON CONFLICT (queue, idempotency_key) DO NOTHING
        RETURNING x.effect_id
    ), marked AS (
        SELECT set_config('pgoutbox.keys_written', 'on', true) AS m
    ), created AS (
        INSERT INTO pgoutbox.effects AS e (id, queue, effect_type, idempotency_key, payload, max_attempts, available_at)
        OVERRIDING SYSTEM VALUE
        SELECT i.id, i.queue, i.effect_type, i.idempotency_key, i.payload, i.max_attempts,
            coalesce(i.available_at, now() + coalesce(i.delay, interval '0'))
        FROM input i JOIN keyed k ON k.effect_id = i.id CROSS JOIN marked
        ORDER BY i.id
        RETURNING e.id
    )
    SELECT array_agg(c.id ORDER BY i.ord) INTO v_ids
    FROM input i LEFT JOIN created c ON c.id = i.id;

    -- The keys that existed, or repeated in the batch: a fresh statement
    -- also sees a row a concurrent transaction committed while the insert
    -- waited for it.
    IF array_position(v_ids, NULL) IS NOT NULL THEN
        SELECT array_agg(coalesce(v_ids[t.ord], k.effect_id) ORDER BY t.ord) INTO v_ids
        FROM unnest(p_queues, p_keys) WITH ORDINALITY AS t(queue, idempotency_key, ord)
        LEFT JOIN LATERAL (
            SELECT x.effect_id FROM pgoutbox.effect_keys x
            WHERE x.queue = t.queue AND x.idempotency_key = t.idempotency_key
            LIMIT 1
        ) k ON v_ids[t.ord] IS NULL;
        IF array_position(v_ids, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'pgoutbox: an idempotency key conflicts with an effect this transaction cannot see'
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;
    RETURN v_ids;
END;
$$;
-- +goose StatementEnd

-- enqueue writes one effect inside the caller's transaction and returns its
-- id (the existing effect's id when the key is taken in the queue).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue(
    queue            text,
    effect_type      text,
    idempotency_key  text,
    payload          json DEFAULT NULL,
    max_attempts     integer DEFAULT NULL,
    available_at     timestamptz DEFAULT NULL,
    delay            interval DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (pgoutbox.enqueue_rows(ARRAY[queue], ARRAY[effect_type], ARRAY[idempotency_key], ARRAY[payload],
                                  ARRAY[max_attempts], ARRAY[available_at], ARRAY[delay]))[1];
END;
$$;
-- +goose StatementEnd

-- enqueue_batch writes a JSON array of effects ({"queue", "effect_type",
-- "idempotency_key", "payload", "max_attempts", "available_at", "delay"};
-- the last four optional) in one statement and returns one row per element: its
-- index (from 0) and its id. One bad element refuses the whole batch.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.enqueue_batch(effects json) RETURNS TABLE (idx integer, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_fields    constant text[] := ARRAY['queue', 'effect_type', 'idempotency_key', 'payload', 'max_attempts', 'available_at',
                                         'delay'];
    v_n         integer;
    v_at        text;
    v_e         json;
    v_f         text;
    v_num       numeric;
    v_queues    text[] := '{}';
    v_types     text[] := '{}';
    v_keys      text[] := '{}';
    v_payloads  json[] := '{}';
    v_attempts  integer[] := '{}';
    v_avail     timestamptz[] := '{}';
    v_delays    interval[] := '{}';
    v_delay     interval;
    v_ts        timestamptz;
    v_ids       bigint[];
BEGIN
    IF effects IS NULL OR json_typeof(effects) <> 'array' THEN
        RAISE EXCEPTION 'pgoutbox: invalid batch: effects must be a JSON array of effect objects'
            USING ERRCODE = 'OB001';
    END IF;
    v_n := json_array_length(effects);
    FOR i IN 0..v_n - 1 LOOP
        v_e := effects -> i;
        v_at := CASE WHEN v_n > 1 THEN format('effect %s: ', i) ELSE '' END;
        IF json_typeof(v_e) <> 'object' THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: must be a JSON object, not %', v_at, json_typeof(v_e)
                USING ERRCODE = 'OB001';
        END IF;
        SELECT k INTO v_f FROM json_object_keys(v_e) AS k WHERE k <> ALL (c_fields) LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: unknown field "%" (the fields are %)', v_at, v_f,
                array_to_string(c_fields, ', ')
                USING ERRCODE = 'OB001', COLUMN = v_f;
        END IF;
        FOREACH v_f IN ARRAY c_fields[1:3] || ARRAY['available_at'] LOOP
            IF coalesce(json_typeof(v_e -> v_f), 'null') NOT IN ('string', 'null') THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: % must be a JSON string, not %', v_at, v_f, json_typeof(v_e -> v_f)
                    USING ERRCODE = 'OB001', COLUMN = v_f;
            END IF;
        END LOOP;
        v_queues := array_append(v_queues, v_e ->> 'queue');
        v_types := array_append(v_types, v_e ->> 'effect_type');
        v_keys := array_append(v_keys, v_e ->> 'idempotency_key');
        v_payloads := array_append(v_payloads, v_e -> 'payload');
        CASE coalesce(json_typeof(v_e -> 'max_attempts'), 'null')
        WHEN 'null' THEN
            v_attempts := array_append(v_attempts, NULL);
        WHEN 'number' THEN
            v_num := (v_e ->> 'max_attempts')::numeric;
            IF v_num <> trunc(v_num) OR v_num < 0 OR v_num > 1000 THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be between 0 (default) and 1000, not %',
                    v_at, v_e ->> 'max_attempts'
                    USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
            END IF;
            v_attempts := array_append(v_attempts, v_num::integer);
        ELSE
            RAISE EXCEPTION 'pgoutbox: %invalid effect: max_attempts must be a JSON number, not %', v_at,
                json_typeof(v_e -> 'max_attempts')
                USING ERRCODE = 'OB001', COLUMN = 'max_attempts';
        END CASE;
        v_ts := NULL;
        IF v_e ->> 'available_at' IS NOT NULL THEN
            BEGIN
                v_ts := (v_e ->> 'available_at')::timestamptz;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: available_at "%" is not a timestamp (ISO 8601, with a time zone)',
                    v_at, v_e ->> 'available_at'
                    USING ERRCODE = 'OB001', COLUMN = 'available_at';
            END;
        END IF;
        v_avail := array_append(v_avail, v_ts);
        -- delay: a number of seconds, or PostgreSQL interval text ("PT5M",
        -- "5 minutes").
        CASE coalesce(json_typeof(v_e -> 'delay'), 'null')
        WHEN 'null' THEN
            v_delay := NULL;
        WHEN 'number' THEN
            v_delay := make_interval(secs => (v_e ->> 'delay')::float8);
        WHEN 'string' THEN
            BEGIN
                v_delay := (v_e ->> 'delay')::interval;
            EXCEPTION WHEN data_exception THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: delay "%" is not an interval', v_at, v_e ->> 'delay'
                    USING ERRCODE = 'OB001', COLUMN = 'delay';
            END;
        ELSE
            RAISE EXCEPTION 'pgoutbox: %invalid effect: delay must be a number of seconds or an interval string, not %',
                v_at, json_typeof(v_e -> 'delay')
                USING ERRCODE = 'OB001', COLUMN = 'delay';
        END CASE;
        v_delays := array_append(v_delays, v_delay);
    END LOOP;
    v_ids := pgoutbox.enqueue_rows(v_queues, v_types, v_keys, v_payloads, v_attempts, v_avail, v_delays);
    RETURN QUERY SELECT (u.o - 1)::integer, u.x FROM unnest(v_ids) WITH ORDINALITY AS u(x, o) ORDER BY u.o;
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval) FROM PUBLIC;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_enqueuer') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval) TO pgoutbox_enqueuer;
    END IF;
END;
$$;
-- +goose StatementEnd

DROP TRIGGER effects_ordered_notify ON pgoutbox.effects;
DROP FUNCTION pgoutbox.notify_ordered();
DROP FUNCTION pgoutbox.ordering_lock(text[], text[]);
DROP TABLE pgoutbox.ordering_types;
DROP TRIGGER effects_ordering_key_immutable ON pgoutbox.effects;
DROP FUNCTION pgoutbox.ordering_key_immutable();
DROP INDEX pgoutbox.effects_ordering_idx;
ALTER TABLE pgoutbox.effects DROP COLUMN ordering_key;
