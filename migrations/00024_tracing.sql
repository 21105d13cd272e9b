-- +goose Up
-- Tracing (issue 31, point 4; docs/operations.md "Tracing"): an effect
-- carries the W3C traceparent of the span that enqueued it, and its
-- delivery continues that trace.
--
--   * pgoutbox.effects.traceparent: NULL (no trace: the default, so an
--     enqueue without a tracing SDK writes nothing more) or a traceparent of
--     version 00, "00-<trace id>-<parent id>-<flags>" in lower-case hex,
--     neither id all zeros (effects_traceparent_format). tracestate is not
--     kept. The constraint is NOT VALID: every row that exists when it is
--     added has a NULL traceparent, and validating them would hold the
--     table's ACCESS EXCLUSIVE lock for a scan of it; new rows are checked.
--   * The SQL API takes it: pgoutbox.enqueue's last argument traceparent
--     (DEFAULT NULL), the field "traceparent" of enqueue_batch's objects. A
--     value that is not NULL and not a version-00 traceparent (55 bytes,
--     checked first) is refused with OB001 on traceparent, and nothing is
--     written. The function's signature changes, so enqueue and
--     enqueue_rows are dropped and created again, with the grants of 00008
--     and 00013: nothing for PUBLIC, EXECUTE on enqueue for
--     pgoutbox_enqueuer; the queue grants of 00015 are checked as before.

ALTER TABLE pgoutbox.effects ADD COLUMN traceparent text;
ALTER TABLE pgoutbox.effects ADD CONSTRAINT effects_traceparent_format CHECK (
    traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
    AND substr(traceparent, 4, 32) <> repeat('0', 32) AND substr(traceparent, 37, 16) <> repeat('0', 16)
) NOT VALID;

DROP FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text);
DROP FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[]);

-- enqueue_rows (00015) writes each effect's traceparent, checked first.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue_rows(
    p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[],
    p_available_at timestamptz[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]
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
    v_caller    name := pgoutbox.enqueue_caller();
    v_open      boolean;
    v_text      text;
    v_reason    text;
    v_i         integer;
BEGIN
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    -- The grants (00015), before anything else: a caller that may not
    -- write the table itself enqueues only what it was granted.
    v_open := has_table_privilege(v_caller, 'pgoutbox.effects', 'INSERT');
    IF NOT v_open THEN
        SELECT t.ord::integer INTO v_i
        FROM unnest(p_queues, p_types) WITH ORDINALITY AS t(queue, effect_type, ord)
        WHERE NOT coalesce(pgoutbox.may_enqueue(v_caller, t.queue, t.effect_type), false)
        ORDER BY t.ord
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgoutbox: %role "%" may not enqueue effect type "%" into queue "%" (the owner grants it with pgoutbox.grant_enqueue)',
                CASE WHEN v_n > 1 THEN format('effect %s: ', v_i - 1) ELSE '' END, v_caller,
                p_types[v_i], p_queues[v_i]
                USING ERRCODE = 'insufficient_privilege', COLUMN = 'queue';
        END IF;
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
        -- A W3C traceparent of version 00 (00024), checked before the
        -- pattern: its length is fixed, whatever the caller sent.
        IF p_traceparents[i] IS NOT NULL AND (octet_length(p_traceparents[i]) <> 55
                OR p_traceparents[i] !~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                OR substr(p_traceparents[i], 4, 32) = repeat('0', 32) OR substr(p_traceparents[i], 37, 16) = repeat('0', 16)) THEN
            RAISE EXCEPTION 'pgoutbox: %invalid effect: traceparent must be NULL (none) or a W3C traceparent of version 00: 00-<trace id: 32 hex>-<parent id: 16 hex>-<flags: 2 hex>, lower case, ids not all zeros', v_at
                USING ERRCODE = 'OB001', COLUMN = 'traceparent';
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
            v_text := p_payloads[i]::text;
            v_size := octet_length(v_text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
            -- The bounds (00015), before jsonb spells the numbers out.
            v_reason := pgoutbox.json_bounds(v_text);
            IF v_reason IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: payload %', v_at, v_reason
                    USING ERRCODE = 'OB001', COLUMN = 'payload';
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
        FROM unnest(p_queues, p_types, p_keys, v_payloads, v_attempts, p_available_at, p_delays, p_ordering_keys,
                    p_traceparents)
            WITH ORDINALITY AS t(queue, effect_type, idempotency_key, payload, max_attempts, available_at, delay,
                                 ordering_key, traceparent, ord)
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
                                           ordering_key, traceparent)
        OVERRIDING SYSTEM VALUE
        SELECT i.id, i.queue, i.effect_type, i.idempotency_key, i.payload, i.max_attempts,
            coalesce(i.available_at, now() + coalesce(i.delay, interval '0')), i.ordering_key, i.traceparent
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
        -- A taken key answers its effect's id only to a caller that may
        -- enqueue that effect (00015): its queue is the element's, its type
        -- may differ (NULL: the effect is gone, its key retained).
        IF NOT v_open THEN
            SELECT t.ord::integer INTO v_i
            FROM unnest(p_queues, v_ids) WITH ORDINALITY AS t(queue, id, ord)
            LEFT JOIN pgoutbox.effects e ON e.id = t.id
            WHERE NOT coalesce(pgoutbox.may_enqueue(v_caller, t.queue, e.effect_type), false)
            ORDER BY t.ord
            LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'pgoutbox: %the idempotency key is taken in queue "%" by an effect role "%" may not enqueue',
                    CASE WHEN v_n > 1 THEN format('effect %s: ', v_i - 1) ELSE '' END, p_queues[v_i], v_caller
                    USING ERRCODE = 'insufficient_privilege', COLUMN = 'idempotency_key';
            END IF;
        END IF;
    END IF;
    RETURN v_ids;
END;
$$;
-- +goose StatementEnd

-- enqueue (00013) takes a traceparent (NULL: none).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue(
    queue            text,
    effect_type      text,
    idempotency_key  text,
    payload          json DEFAULT NULL,
    max_attempts     integer DEFAULT NULL,
    available_at     timestamptz DEFAULT NULL,
    delay            interval DEFAULT NULL,
    ordering_key     text DEFAULT NULL,
    traceparent      text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (pgoutbox.enqueue_rows(ARRAY[queue], ARRAY[effect_type], ARRAY[idempotency_key], ARRAY[payload],
                                  ARRAY[max_attempts], ARRAY[available_at], ARRAY[delay], ARRAY[ordering_key],
                                  ARRAY[traceparent]))[1];
END;
$$;
-- +goose StatementEnd

-- enqueue_batch (00015) reads the field "traceparent" (a JSON string or
-- null).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.enqueue_batch(effects json) RETURNS TABLE (idx integer, id bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_fields    constant text[] := ARRAY['queue', 'effect_type', 'idempotency_key', 'payload', 'max_attempts', 'available_at',
                                         'delay', 'ordering_key', 'traceparent'];
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
    v_tps       text[] := '{}';
    v_delay     interval;
    v_ts        timestamptz;
    v_ids       bigint[];
    i           integer := -1;
BEGIN
    IF effects IS NULL OR json_typeof(effects) <> 'array' THEN
        RAISE EXCEPTION 'pgoutbox: invalid batch: effects must be a JSON array of effect objects'
            USING ERRCODE = 'OB001';
    END IF;
    v_n := json_array_length(effects);
    -- One pass over the array (00015): effects -> i re-read it from the
    -- start for every element.
    FOR v_e IN SELECT a.value FROM json_array_elements(effects) AS a LOOP
        i := i + 1;
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
        FOREACH v_f IN ARRAY c_fields[1:3] || ARRAY['available_at', 'ordering_key', 'traceparent'] LOOP
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
            -- Bounded before numeric reads it (00015).
            v_num := CASE WHEN pgoutbox.json_bounds(v_e ->> 'max_attempts') IS NULL
                          THEN (v_e ->> 'max_attempts')::numeric END;
            IF v_num IS NULL OR v_num <> trunc(v_num) OR v_num < 0 OR v_num > 1000 THEN
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
            IF pgoutbox.json_bounds(v_e ->> 'delay') IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: delay % is not a number of seconds', v_at, v_e ->> 'delay'
                    USING ERRCODE = 'OB001', COLUMN = 'delay';
            END IF;
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
        v_tps := array_append(v_tps, v_e ->> 'traceparent');
    END LOOP;
    v_ids := pgoutbox.enqueue_rows(v_queues, v_types, v_keys, v_payloads, v_attempts, v_avail, v_delays, v_okeys,
                                   v_tps);
    RETURN QUERY SELECT (u.o - 1)::integer, u.x FROM unnest(v_ids) WITH ORDINALITY AS u(x, o) ORDER BY u.o;
END;
$$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text, text) FROM PUBLIC;

-- The role of 00008 may call the new enqueue (it lost the dropped one).
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_enqueuer') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text, text) TO pgoutbox_enqueuer;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- The functions of 00015 and 00013, as they were.
DROP FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text, text);
DROP FUNCTION pgoutbox.enqueue_rows(text[], text[], text[], json[], integer[], timestamptz[], interval[], text[], text[]);

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
    v_caller    name := pgoutbox.enqueue_caller();
    v_open      boolean;
    v_text      text;
    v_reason    text;
    v_i         integer;
BEGIN
    IF v_n = 0 THEN
        RETURN '{}';
    END IF;
    -- The grants (00015), before anything else: a caller that may not
    -- write the table itself enqueues only what it was granted.
    v_open := has_table_privilege(v_caller, 'pgoutbox.effects', 'INSERT');
    IF NOT v_open THEN
        SELECT t.ord::integer INTO v_i
        FROM unnest(p_queues, p_types) WITH ORDINALITY AS t(queue, effect_type, ord)
        WHERE NOT coalesce(pgoutbox.may_enqueue(v_caller, t.queue, t.effect_type), false)
        ORDER BY t.ord
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'pgoutbox: %role "%" may not enqueue effect type "%" into queue "%" (the owner grants it with pgoutbox.grant_enqueue)',
                CASE WHEN v_n > 1 THEN format('effect %s: ', v_i - 1) ELSE '' END, v_caller,
                p_types[v_i], p_queues[v_i]
                USING ERRCODE = 'insufficient_privilege', COLUMN = 'queue';
        END IF;
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
            v_text := p_payloads[i]::text;
            v_size := octet_length(v_text);
            IF v_size > 65536 THEN
                RAISE EXCEPTION 'pgoutbox: %payload is % bytes, over the 65536-byte limit', v_at, v_size
                    USING ERRCODE = 'OB002', COLUMN = 'payload';
            END IF;
            -- The bounds (00015), before jsonb spells the numbers out.
            v_reason := pgoutbox.json_bounds(v_text);
            IF v_reason IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: payload %', v_at, v_reason
                    USING ERRCODE = 'OB001', COLUMN = 'payload';
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
        -- A taken key answers its effect's id only to a caller that may
        -- enqueue that effect (00015): its queue is the element's, its type
        -- may differ (NULL: the effect is gone, its key retained).
        IF NOT v_open THEN
            SELECT t.ord::integer INTO v_i
            FROM unnest(p_queues, v_ids) WITH ORDINALITY AS t(queue, id, ord)
            LEFT JOIN pgoutbox.effects e ON e.id = t.id
            WHERE NOT coalesce(pgoutbox.may_enqueue(v_caller, t.queue, e.effect_type), false)
            ORDER BY t.ord
            LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'pgoutbox: %the idempotency key is taken in queue "%" by an effect role "%" may not enqueue',
                    CASE WHEN v_n > 1 THEN format('effect %s: ', v_i - 1) ELSE '' END, p_queues[v_i], v_caller
                    USING ERRCODE = 'insufficient_privilege', COLUMN = 'idempotency_key';
            END IF;
        END IF;
    END IF;
    RETURN v_ids;
END;
$$;
-- +goose StatementEnd

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
    i           integer := -1;
BEGIN
    IF effects IS NULL OR json_typeof(effects) <> 'array' THEN
        RAISE EXCEPTION 'pgoutbox: invalid batch: effects must be a JSON array of effect objects'
            USING ERRCODE = 'OB001';
    END IF;
    v_n := json_array_length(effects);
    -- One pass over the array (00015): effects -> i re-read it from the
    -- start for every element.
    FOR v_e IN SELECT a.value FROM json_array_elements(effects) AS a LOOP
        i := i + 1;
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
            -- Bounded before numeric reads it (00015).
            v_num := CASE WHEN pgoutbox.json_bounds(v_e ->> 'max_attempts') IS NULL
                          THEN (v_e ->> 'max_attempts')::numeric END;
            IF v_num IS NULL OR v_num <> trunc(v_num) OR v_num < 0 OR v_num > 1000 THEN
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
            IF pgoutbox.json_bounds(v_e ->> 'delay') IS NOT NULL THEN
                RAISE EXCEPTION 'pgoutbox: %invalid effect: delay % is not a number of seconds', v_at, v_e ->> 'delay'
                    USING ERRCODE = 'OB001', COLUMN = 'delay';
            END IF;
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
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_enqueuer') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.enqueue(text, text, text, json, integer, timestamptz, interval, text) TO pgoutbox_enqueuer;
    END IF;
END;
$$;
-- +goose StatementEnd

ALTER TABLE pgoutbox.effects DROP COLUMN traceparent;
