-- The current schema pgoutbox, as the migrations leave it (pg_dump --schema-only --no-owner).
-- Generated: go test ./migrations -run TestSchemaFilesAreCurrent -update-schema. Do not edit;
-- change the schema with a new migration.
CREATE SCHEMA pgoutbox;

CREATE TYPE pgoutbox.effect_state AS ENUM (
    'available',
    'leased',
    'completed',
    'dead_letter',
    'reconciliation_required'
);

CREATE FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer DEFAULT 1, lease interval DEFAULT '00:00:30'::interval, from_stream boolean DEFAULT true) RETURNS TABLE(id bigint, effect_type text, idempotency_key text, payload jsonb, attempt integer, max_attempts integer, lease_token uuid, created_at timestamp with time zone, delivery_started_at timestamp with time zone, ordering_key text, traceparent text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), claim.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(claim.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(claim.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    PERFORM pgoutbox.work_refuse_bound(claim.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_bound(claim.from_stream IS NULL, 'from_stream', 'must be true or false');
    IF claim.from_stream THEN
        PERFORM pgoutbox.stream_to_rows(claim.queue, claim.max_effects);
    END IF;
    RETURN QUERY
    SELECT c.r_id, c.r_effect_type, c.r_key, c.r_payload, c.r_attempts, c.r_max_attempts, c.r_token,
        c.r_created_at, c.r_delivery_started_at, nullif(c.r_ordering_key, ''), nullif(c.r_traceparent, '')
    FROM pgoutbox.work_claim_rows(claim.queue, claim.max_effects, claim.worker,
        extract(epoch FROM claim.lease)::float8, 1) c;
END;
$$;

CREATE FUNCTION pgoutbox.claim_batch(queue text, worker text, effect_types text[], max_effects integer DEFAULT 100, lease interval DEFAULT '00:00:30'::interval) RETURNS TABLE(batch_id bigint, batch_token uuid, through bigint, id bigint, effect_type text, idempotency_key text, payload jsonb, attempt integer, max_attempts integer, created_at timestamp with time zone, ordering_key text, traceparent text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    b         pgoutbox.stream_batches;
    v_id      bigint;
    v_relet   boolean;
    v_page    pgoutbox.stream[];
    v_through bigint;
    v_held    text[];
    v_run     bigint[];
    v_tried   bigint[];
    v_firsts  bigint[];
    v_n       integer;
    v_ticked  boolean := false;
    v_pages   integer := 0;
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), claim_batch.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(claim_batch.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(claim_batch.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    PERFORM pgoutbox.work_refuse_bound(claim_batch.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_bound(coalesce(cardinality(claim_batch.effect_types), 0) NOT BETWEEN 1 AND 100
        OR EXISTS (SELECT FROM unnest(claim_batch.effect_types) t WHERE t IS NULL OR octet_length(t) NOT BETWEEN 1 AND 128),
        'effect_types', 'must be 1 to 100 type names of 1-128 bytes');
    IF NOT EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = claim_batch.queue AND s.storage = 'batch')
       AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream x WHERE x.queue = claim_batch.queue) THEN
        RETURN;
    END IF;
    WHILE v_pages < 4 LOOP
        SELECT c.r_id, c.r_relet INTO v_id, v_relet
        FROM pgoutbox.work_claim_batch(claim_batch.queue, claim_batch.worker,
            extract(epoch FROM claim_batch.lease)::float8) c;
        IF NOT FOUND THEN
            -- None to lease: tick once (a closed batch per lane), as the
            -- Go Client does, and try again.
            IF v_ticked OR current_setting('transaction_isolation') <> 'read committed' THEN
                RETURN;
            END IF;
            PERFORM pgoutbox.stream_tick(claim_batch.queue);
            v_ticked := true;
            CONTINUE;
        END IF;
        v_pages := v_pages + 1;
        SELECT x.* INTO b FROM pgoutbox.stream_batches x WHERE x.queue = claim_batch.queue AND x.id = v_id;
        v_page := pgoutbox.stream_page_of(b, b.max_id, claim_batch.max_effects);
        v_through := CASE WHEN cardinality(v_page) < claim_batch.max_effects THEN b.max_id
            ELSE v_page[cardinality(v_page)].id END;
        v_firsts := pgoutbox.stream_page_firsts(v_page);
        SELECT array_agg(DISTINCT k) INTO v_held
        FROM pgoutbox.work_held_keys(claim_batch.queue,
            ARRAY(SELECT DISTINCT p.ordering_key FROM unnest(v_page) p WHERE p.ordering_key IS NOT NULL)) k;
        -- The first of each ordering key in the page, of the caller's
        -- types, due (tried); of those, the ones whose key nothing holds
        -- (run).
        SELECT array_agg(p.id) FILTER (WHERE p.ordering_key IS NULL OR p.ordering_key <> ALL(coalesce(v_held, '{}'))),
            array_agg(p.id)
        INTO v_run, v_tried
        FROM unnest(v_page) p
        WHERE p.id = ANY(v_firsts) AND p.effect_type = ANY(claim_batch.effect_types)
          AND p.available_at <= now();
        IF v_relet THEN
            -- The former holder let the lease expire: it may have died
            -- delivering one of these. Each moves to the row storage,
            -- where a durable lease counts every attempt; the ones that
            -- may have run have that attempt recorded (Go's deliverPage).
            v_n := coalesce(cardinality(v_tried), 0);
            PERFORM pgoutbox.stream_settle_page(claim_batch.queue, b.id, b.lease_token, v_through, v_through = b.max_id,
                claim_batch.worker, v_page, '{}', coalesce(v_tried, '{}'), array_fill('available'::text, ARRAY[v_n]),
                array_fill(1, ARRAY[v_n]), array_fill(0::float8, ARRAY[v_n]),
                array_fill('the batch lease expired before this page was settled; delivered again under a durable lease'::text,
                    ARRAY[v_n]));
            CONTINUE;
        END IF;
        IF v_run IS NULL THEN
            PERFORM pgoutbox.stream_settle_page(claim_batch.queue, b.id, b.lease_token, v_through, v_through = b.max_id,
                claim_batch.worker, v_page, '{}', '{}', '{}', '{}', '{}', '{}');
            CONTINUE;
        END IF;
        RETURN QUERY
        SELECT b.id, b.lease_token, v_through, p.id, p.effect_type, p.idempotency_key, p.payload::jsonb, 1, p.max_attempts,
            p.created_at, p.ordering_key, p.traceparent
        FROM unnest(v_page) p WHERE p.id = ANY(v_run) ORDER BY p.id;
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION pgoutbox.clear_left_batch() RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_queues text[];
    v_n      integer := 0;
    v_saved  text := current_setting('lock_timeout');
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: clear_left_batch must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    SELECT array_agg(q.queue) INTO v_queues FROM pgoutbox.queue_storage q
    WHERE q.left_batch_at IS NOT NULL AND q.storage = 'rows'
      AND pgoutbox.stream_floor(q.queue) IS NULL;
    IF v_queues IS NULL THEN
        RETURN 0;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM count(*) FROM (SELECT 1 FROM pgoutbox.ordering_stripes s ORDER BY s.stripe FOR SHARE) l;
        UPDATE pgoutbox.queue_storage q SET left_batch_at = NULL
        WHERE q.queue = ANY (v_queues) AND q.left_batch_at IS NOT NULL AND q.storage = 'rows'
          AND pgoutbox.stream_floor(q.queue) IS NULL;
        GET DIAGNOSTICS v_n = ROW_COUNT;
    EXCEPTION WHEN lock_not_available THEN
        NULL; -- an enqueue holds an ordering lock: the next call tries again
    END;
    PERFORM set_config('lock_timeout', v_saved, true);
    RETURN v_n;
END;
$$;

CREATE FUNCTION pgoutbox.complete(id bigint, lease_token uuid, effect_type text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM pgoutbox.work_refuse_fences(pgoutbox.enqueue_caller(), ARRAY[complete.id], ARRAY[complete.lease_token]);
    SELECT count(*) INTO v_n
    FROM pgoutbox.work_complete_rows(ARRAY[complete.id], ARRAY[complete.lease_token], ARRAY[complete.effect_type]);
    RETURN v_n = 1;
END;
$$;

CREATE FUNCTION pgoutbox.credential_key_path(payload json) RETURNS text
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    SET plan_cache_mode TO 'force_generic_plan'
    AS $_$
DECLARE
    v_text   text := payload::text;
    v_nth    bigint;
    v_tok    text;
    v_seen   bigint := 0;
    v_depth  integer := 0;
    v_kind   text[] := '{}';
    v_name   text[] := '{}';
    v_idx    integer[] := '{}';
    v_key    boolean[] := '{}'; -- the object at this depth expects a key next
    v_path   text := '$';
BEGIN
    IF NOT pgoutbox.may_hold_credential_key(v_text) THEN
        RETURN NULL;
    END IF;
    SELECT r.ord INTO v_nth
    FROM regexp_matches(v_text, '("(?:[^"\\]|\\.)*")(\s*:)?', 'g') WITH ORDINALITY AS r(m, ord)
    WHERE r.m[2] IS NOT NULL AND pgoutbox.may_hold_credential_key(r.m[1])
      AND pgoutbox.is_credential_key(r.m[1]::json #>> '{}')
    ORDER BY r.ord
    LIMIT 1;
    IF v_nth IS NULL THEN
        RETURN NULL;
    END IF;
    -- The refused key is the v_nth string: walk the tokens up to it.
    FOR v_tok IN SELECT t.m[1] FROM regexp_matches(v_text, '("(?:[^"\\]|\\.)*"|[][{}:,])', 'g') AS t(m) LOOP
        CASE left(v_tok, 1)
        WHEN '{', '[' THEN
            v_depth := v_depth + 1;
            v_kind[v_depth] := v_tok;
            v_idx[v_depth] := 0;
            v_key[v_depth] := v_tok = '{';
        WHEN '}', ']' THEN
            v_depth := v_depth - 1;
        WHEN ',' THEN
            IF v_kind[v_depth] = '[' THEN
                v_idx[v_depth] := v_idx[v_depth] + 1;
            ELSE
                v_key[v_depth] := true;
            END IF;
        WHEN ':' THEN
            NULL;
        ELSE
            v_seen := v_seen + 1;
            IF v_seen = v_nth THEN
                FOR d IN 1..v_depth - 1 LOOP
                    v_path := v_path || CASE WHEN v_kind[d] = '[' THEN '[' || v_idx[d] || ']'
                                             ELSE '.' || (v_name[d]::json #>> '{}') END;
                END LOOP;
                RETURN v_path || '.' || (v_tok::json #>> '{}');
            END IF;
            IF v_depth > 0 AND v_key[v_depth] THEN
                v_name[v_depth] := v_tok;
                v_key[v_depth] := false;
            END IF;
        END CASE;
    END LOOP;
    RETURN NULL;
END;
$_$;

CREATE FUNCTION pgoutbox.dead_letter_moves_on(p_queue text, p_type text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p_queue AND c.effect_type = p_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p_type),
        false)
$$;

CREATE FUNCTION pgoutbox.effect_attempts_delete() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM pgoutbox.effect_attempts
    WHERE effect_id = ANY(ARRAY(SELECT o.id FROM old_effects o));
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.effect_attempts_record() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

CREATE FUNCTION pgoutbox.effect_attempts_truncate() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    TRUNCATE pgoutbox.effect_attempts;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.effect_keys_immutable() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.queue IS DISTINCT FROM OLD.queue OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key THEN
        RAISE EXCEPTION 'pgoutbox: the queue and idempotency key of effect % cannot be changed', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'effects_key_immutable';
    END IF;
    RETURN NEW;
END;
$$;

CREATE FUNCTION pgoutbox.effect_keys_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION pgoutbox.effect_keys_truncate() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    TRUNCATE pgoutbox.effect_keys;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.effects_to_stream() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.enqueue(queue text, effect_type text, idempotency_key text, payload json DEFAULT NULL::json, max_attempts integer DEFAULT NULL::integer, available_at timestamp with time zone DEFAULT NULL::timestamp with time zone, delay interval DEFAULT NULL::interval, ordering_key text DEFAULT NULL::text, traceparent text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (pgoutbox.enqueue_rows(ARRAY[queue], ARRAY[effect_type], ARRAY[idempotency_key], ARRAY[payload],
                                  ARRAY[max_attempts], ARRAY[available_at], ARRAY[delay], ARRAY[ordering_key],
                                  ARRAY[traceparent]))[1];
END;
$$;

CREATE FUNCTION pgoutbox.enqueue_batch(effects json) RETURNS TABLE(idx integer, id bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.enqueue_caller() RETURNS name
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END
$$;

CREATE FUNCTION pgoutbox.enqueue_rows(p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[], p_available_at timestamp with time zone[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM set_config('pgoutbox.routed', 'off', true), set_config('pgoutbox.stream_notified', '', true);
    RETURN pgoutbox.enqueue_rows_routed(p_queues, p_types, p_keys, p_payloads, p_max_attempts, p_available_at,
        p_delays, p_ordering_keys, p_traceparents);
END;
$$;

CREATE FUNCTION pgoutbox.enqueue_rows_routed(p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[], p_available_at timestamp with time zone[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

CREATE FUNCTION pgoutbox.extend(ids bigint[], lease_tokens uuid[], effect_types text[], lease interval) RETURNS TABLE(id bigint, lease_token uuid)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer := cardinality(extend.ids);
BEGIN
    PERFORM pgoutbox.work_refuse_bound(v_n NOT BETWEEN 1 AND 1000
        OR cardinality(extend.lease_tokens) <> v_n OR cardinality(extend.effect_types) <> v_n
        OR array_position(extend.ids, NULL) IS NOT NULL OR array_position(extend.lease_tokens, NULL) IS NOT NULL
        OR array_position(extend.effect_types, NULL) IS NOT NULL, 'ids',
        'lease_tokens and effect_types must be arrays of one length, 1 to 1000, without NULL');
    PERFORM pgoutbox.work_refuse_bound(extend.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_fences(pgoutbox.enqueue_caller(), extend.ids, extend.lease_tokens);
    RETURN QUERY
    SELECT x.r_id, x.r_token
    FROM pgoutbox.work_extend_rows(extend.ids, extend.lease_tokens, extend.effect_types,
        extract(epoch FROM extend.lease)::float8) x;
END;
$$;

CREATE FUNCTION pgoutbox.extend_batch(queue text, batch_id bigint, batch_token uuid, lease interval DEFAULT '00:00:30'::interval) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), extend_batch.queue);
    PERFORM pgoutbox.work_refuse_bound(extend_batch.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    RETURN EXISTS (SELECT FROM pgoutbox.work_extend_batch(extend_batch.queue, extend_batch.batch_id,
        extend_batch.batch_token, extract(epoch FROM extend_batch.lease)::float8));
END;
$$;

CREATE FUNCTION pgoutbox.fail(id bigint, lease_token uuid, effect_type text, outcome text, error text, replay_safe boolean, retry_after interval DEFAULT NULL::interval, backoff_cap interval DEFAULT '00:05:00'::interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_attempt  integer;
    v_cap      float8;
    v_delay    float8;
    v_kind     text := 'retry';
    v_state    text;
BEGIN
    PERFORM pgoutbox.work_refuse_fences(pgoutbox.enqueue_caller(), ARRAY[fail.id], ARRAY[fail.lease_token]);
    PERFORM pgoutbox.work_refuse_bound(fail.outcome NOT IN ('retry', 'retry_after', 'permanent', 'ambiguous', 'release'),
        'outcome', 'must be retry, retry_after, permanent, ambiguous or release');
    PERFORM pgoutbox.work_refuse_bound(octet_length(fail.error) > 65536, 'error', 'must be text of at most 65536 bytes');
    PERFORM pgoutbox.work_refuse_bound(fail.replay_safe IS NULL, 'replay_safe', 'must be true or false');
    PERFORM pgoutbox.work_refuse_bound((fail.outcome = 'retry_after') <> (fail.retry_after IS NOT NULL)
        OR coalesce(fail.retry_after NOT BETWEEN interval '0' AND interval '1 day', false), 'retry_after',
        'is required with outcome retry_after only, between 0 and 1 day');
    PERFORM pgoutbox.work_refuse_bound(fail.backoff_cap NOT BETWEEN interval '1 second' AND interval '1 day',
        'backoff_cap', 'must be between 1 second and 1 day');
    SELECT e.attempts INTO v_attempt FROM pgoutbox.effects e
    WHERE e.id = fail.id AND e.state::text = 'leased' AND e.lease_token = fail.lease_token
      AND e.effect_type = fail.effect_type;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    -- Go's failRoute (lease.go).
    v_cap := extract(epoch FROM fail.backoff_cap);
    v_delay := pgoutbox.retry_backoff(v_attempt, v_cap);
    CASE fail.outcome
    WHEN 'retry_after' THEN
        v_delay := greatest(v_delay, least(extract(epoch FROM fail.retry_after)::float8, greatest(3600, v_cap)));
    WHEN 'permanent' THEN
        v_kind := 'dead_letter';
    WHEN 'ambiguous' THEN
        IF NOT fail.replay_safe THEN
            v_kind := 'reconcile';
        END IF;
    WHEN 'release' THEN
        v_kind := 'release';
        v_delay := 0;
    ELSE
        NULL;
    END CASE;
    SELECT s INTO v_state
    FROM pgoutbox.work_fail_row(fail.id, fail.lease_token, fail.effect_type, v_kind, v_delay, fail.error) AS s;
    RETURN v_state;
END;
$$;

CREATE FUNCTION pgoutbox.fold_key(s text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT translate(s, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ' || chr(8490) || chr(304), 'abcdefghijklmnopqrstuvwxyzki')
$$;

CREATE FUNCTION pgoutbox.grant_enqueue(role_name text, queue text, effect_type text DEFAULT NULL::text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    c_blank  constant text := '^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$';
    v_n      integer;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = grant_enqueue.role_name) THEN
        RAISE EXCEPTION 'pgoutbox: role "%" does not exist', grant_enqueue.role_name
            USING ERRCODE = 'undefined_object';
    END IF;
    IF grant_enqueue.queue IS NULL OR octet_length(grant_enqueue.queue) > 128 OR grant_enqueue.queue ~ c_blank THEN
        RAISE EXCEPTION 'pgoutbox: invalid grant: queue must be 1-128 bytes, not only white space'
            USING ERRCODE = 'OB001', COLUMN = 'queue';
    END IF;
    IF grant_enqueue.effect_type IS NOT NULL
        AND (octet_length(grant_enqueue.effect_type) > 128 OR grant_enqueue.effect_type ~ c_blank) THEN
        RAISE EXCEPTION 'pgoutbox: invalid grant: effect_type must be NULL (every type) or 1-128 bytes, not only white space'
            USING ERRCODE = 'OB001', COLUMN = 'effect_type';
    END IF;
    INSERT INTO pgoutbox.enqueue_grants (grantee, queue, effect_type)
    VALUES (grant_enqueue.role_name, grant_enqueue.queue, grant_enqueue.effect_type)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n = 1;
END;
$_$;

CREATE FUNCTION pgoutbox.grant_work(role_name text, queue text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    c_blank  constant text := '^[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]*$';
    v_n      integer;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = grant_work.role_name) THEN
        RAISE EXCEPTION 'pgoutbox: role "%" does not exist', grant_work.role_name
            USING ERRCODE = 'undefined_object';
    END IF;
    IF grant_work.queue IS NULL OR octet_length(grant_work.queue) > 128 OR grant_work.queue ~ c_blank THEN
        RAISE EXCEPTION 'pgoutbox: invalid grant: queue must be 1-128 bytes, not only white space'
            USING ERRCODE = 'OB001', COLUMN = 'queue';
    END IF;
    INSERT INTO pgoutbox.work_grants (grantee, queue) VALUES (grant_work.role_name, grant_work.queue)
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n = 1;
END;
$_$;

CREATE FUNCTION pgoutbox.has_credential_stem(s text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT s ~ '[tT][oO][kK\u212A][eE][nN]|[sS][eE][cC][rR][eE][tT]|[pP][aA][sS][sS]|[aA][uU][tT][hH]|[cC][rR][eE][dD][eE][nN][tT][iI\u0130][aA][lL]|[kK\u212A][eE][yY]|[cC][oO][oO][kK\u212A][iI\u0130][eE]|[pP][wW][dD]|[bB][eE][aA][rR][eE][rR]|[jJ][wW][tT]|[dD][sS][nN]|[sS][eE][sS][sS]|[sS][iI\u0130][dD]'
$$;

CREATE FUNCTION pgoutbox.is_credential_key(k text) RETURNS boolean
    LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
    v_chars  text[];
    v_cls    "char"[];
    v_n      integer;
    v_start  integer := 0; -- first character of the current word; 0: none
    v_words  text[] := '{}';
    v_w      text;
    v_prev   text;
BEGIN
    IF NOT pgoutbox.has_credential_stem(k) THEN
        RETURN false;
    END IF;
    IF octet_length(k) = char_length(k) THEN
        -- ASCII: splitWords' two upper-case boundaries (after a lower-case
        -- letter; before an upper-case letter followed by a lower-case one
        -- and preceded by an upper-case one) as regular expressions, then
        -- everything but letters and digits separates.
        v_words := regexp_split_to_array(
            pgoutbox.fold_key(regexp_replace(regexp_replace(k, '([a-z])([A-Z])', '\1 \2', 'g'),
                                             '([A-Z])([A-Z][a-z])', '\1 \2', 'g')),
            '[^a-z0-9]+');
    ELSE
        v_chars := string_to_array(k, NULL);
        v_n := array_length(v_chars, 1);
        SELECT array_agg(coalesce(r.class, 'S') ORDER BY t.ord) INTO v_cls
        FROM unnest(v_chars) WITH ORDINALITY AS t(ch, ord)
        LEFT JOIN LATERAL (
            SELECT CASE WHEN ascii(t.ch) <= x.hi THEN x.class END AS class
            FROM pgoutbox.key_rune_classes x
            WHERE x.lo <= ascii(t.ch)
            ORDER BY x.lo DESC
            LIMIT 1
        ) r ON true;
        FOR i IN 1..v_n LOOP
            IF v_cls[i] = 'S' THEN
                IF v_start > 0 THEN
                    v_words := array_append(v_words, array_to_string(v_chars[v_start:i - 1], ''));
                    v_start := 0;
                END IF;
            ELSIF v_cls[i] = 'U' AND i > 1
                AND (v_cls[i - 1] = 'L' OR (i < v_n AND v_cls[i + 1] = 'L' AND v_cls[i - 1] = 'U')) THEN
                IF v_start > 0 THEN
                    v_words := array_append(v_words, array_to_string(v_chars[v_start:i - 1], ''));
                END IF;
                v_start := i;
            ELSIF v_start = 0 THEN
                v_start := i;
            END IF;
        END LOOP;
        IF v_start > 0 THEN
            v_words := array_append(v_words, array_to_string(v_chars[v_start:v_n], ''));
        END IF;
    END IF;
    FOREACH v_w IN ARRAY v_words LOOP
        CONTINUE WHEN v_w = '';
        v_w := pgoutbox.fold_key(v_w);
        -- Go's credentialWords and credentialPairs.
        IF v_w IN ('token', 'tokens', 'secret', 'secrets', 'password', 'passwd', 'passphrase',
                   'authorization', 'credential', 'credentials', 'apikey', 'privatekey', 'cookie',
                   'pwd', 'passcode', 'auth', 'bearer', 'jwt', 'dsn', 'cookies', 'privkey', 'sessionid',
                   'sessid', 'phpsessid', 'jsessionid')
            OR (v_w = 'key' AND v_prev IN ('private', 'api', 'access', 'secret', 'session'))
            OR (v_w = 'id' AND v_prev = 'session')
            OR (v_w = 'sid' AND v_prev = 'connect') THEN
            RETURN true;
        END IF;
        v_prev := v_w;
    END LOOP;
    RETURN false;
END;
$$;

CREATE FUNCTION pgoutbox.json_bounds(s text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
    v_bare   text := regexp_replace(s, '"(?:[^"\\]|\\.)*"', '""', 'g');
    v_br     text := regexp_replace(v_bare, '[^][{}]+', '', 'g');
    v_depth  integer;
BEGIN
    -- Valid JSON closes what it opens: 128 brackets or fewer nest at most 64.
    IF octet_length(v_br) > 128 THEN
        SELECT max(d) INTO v_depth FROM (
            SELECT sum(CASE WHEN u.c IN ('[', '{') THEN 1 ELSE -1 END) OVER (ORDER BY u.o) AS d
            FROM unnest(string_to_array(v_br, NULL)) WITH ORDINALITY AS u(c, o)) x;
        IF v_depth > 64 THEN
            RETURN 'nests deeper than 64 levels of arrays and objects';
        END IF;
    END IF;
    -- Outside strings, only numbers (and the e of true and false) use these.
    IF v_bare ~ '[-+.0-9eE]{101}' THEN
        RETURN 'has a number literal longer than 100 characters';
    END IF;
    IF v_bare ~ '[eE][-+]?0*[1-9][0-9]{2}' AND EXISTS (
        SELECT FROM regexp_matches(v_bare, '[eE][-+]?0*([0-9]+)', 'g') AS m
        WHERE CASE WHEN length(m[1]) > 3 THEN true ELSE m[1]::integer > 400 END) THEN
        RETURN 'has a number with an exponent beyond ±400';
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.key(VARIADIC parts text[]) RETURNS text
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
BEGIN
    IF parts IS NULL OR array_position(parts, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'pgoutbox: key parts must not be NULL' USING ERRCODE = 'OB001';
    END IF;
    RETURN encode(sha256(convert_to(array_to_string(parts, '|'), 'UTF8')), 'hex');
END;
$$;

CREATE FUNCTION pgoutbox.mark_started(id bigint, lease_token uuid, effect_type text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_fences(pgoutbox.enqueue_caller(), ARRAY[mark_started.id],
        ARRAY[mark_started.lease_token]);
    RETURN EXISTS (SELECT FROM pgoutbox.work_start_row(mark_started.id, mark_started.lease_token,
        mark_started.effect_type));
END;
$$;

CREATE FUNCTION pgoutbox.may_enqueue(p_role name, p_queue text, p_type text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT has_table_privilege(p_role, 'pgoutbox.effects', 'INSERT')
        OR EXISTS (
            SELECT FROM pgoutbox.enqueue_grants g JOIN pg_roles r ON r.rolname = g.grantee
            WHERE g.queue = p_queue AND (g.effect_type IS NULL OR g.effect_type = p_type)
              AND pg_has_role(p_role, r.oid, 'USAGE'))
$$;

CREATE FUNCTION pgoutbox.may_hold_credential_key(s text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT strpos(s, '\u') > 0 OR pgoutbox.has_credential_stem(s)
$$;

CREATE FUNCTION pgoutbox.may_work(p_role name, p_queue text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$BEGIN
RETURN (
SELECT has_table_privilege(p_role, 'pgoutbox.effects', 'UPDATE')
        OR EXISTS (
            SELECT FROM pgoutbox.work_grants g JOIN pg_roles r ON r.rolname = g.grantee
            WHERE g.queue = p_queue AND pg_has_role(p_role, r.oid, 'USAGE')));
END;$$;

CREATE FUNCTION pgoutbox.notify_at_commit() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.notify_effects() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.notify_ordered() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- Identical notifications of one transaction are folded into one.
    PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.notify_stream() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.ordering_key_immutable() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.ordering_key IS DISTINCT FROM OLD.ordering_key THEN
        RAISE EXCEPTION 'pgoutbox: the ordering key of effect % cannot be changed', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'effects_ordering_key_immutable';
    END IF;
    RETURN NEW;
END;
$$;

CREATE FUNCTION pgoutbox.ordering_lock(p_queues text[], p_ordering_keys text[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.queue_storage_left_batch() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NEW.storage = 'batch' THEN
        NEW.left_batch_at := NULL;
    ELSIF OLD.storage = 'batch' THEN
        NEW.left_batch_at := now();
    END IF;
    RETURN NEW;
END;
$$;

CREATE FUNCTION pgoutbox.recover_expired(queue text, max_effects integer DEFAULT 100) RETURNS TABLE(id bigint, effect_type text, state text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), recover_expired.queue);
    PERFORM pgoutbox.work_refuse_bound(recover_expired.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    RETURN QUERY
    SELECT s.r_id, s.r_effect_type, s.r_state
    FROM pgoutbox.work_sweep_rows(recover_expired.max_effects, 0, recover_expired.queue) s;
END;
$$;

CREATE FUNCTION pgoutbox.recovered_state(delivery_started_at timestamp with time zone, attempts integer, max_attempts integer) RETURNS pgoutbox.effect_state
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (CASE
        WHEN delivery_started_at IS NOT NULL THEN 'reconciliation_required'
        WHEN attempts >= max_attempts THEN 'dead_letter'
        ELSE 'available'
    END)::pgoutbox.effect_state
$$;

CREATE FUNCTION pgoutbox.replay_barriers_release() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM pgoutbox.replay_barriers w WHERE w.queue = NEW.queue AND w.batch_id = NEW.id;
    IF FOUND THEN
        PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.replay_dead_letters(p_ids bigint[], p_queue text, p_type text, p_limit integer) RETURNS TABLE(id bigint, queue text, effect_type text, state text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
DECLARE
    v_ids   bigint[];
    v_next  bigint;
    v_state text;
    r       record;
    v_queue  text;
    v_head   bigint;
    v_locked boolean;
    v_batch  pgoutbox.stream_batches;
    v_slot   smallint;
BEGIN
    SELECT array_agg(x.id ORDER BY x.id) INTO v_ids FROM (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.state = 'dead_letter'
          AND (cardinality(p_ids) = 0 OR e.id = ANY(p_ids))
          AND (p_queue = '' OR e.queue = p_queue) AND (p_type = '' OR e.effect_type = p_type)
        ORDER BY e.id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED) x;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;

    -- Batch storage: a later effect of a move-on dead letter's key may be
    -- in delivery from a batch page, which writes no row until it settles.
    -- Each queue of such a dead letter that is a batch queue, or still has
    -- open batches, gets, for each slot of their keys (migration 00031), its
    -- oldest open batch holding the slot (the only one of them a consumer
    -- may lease) share-locked, so no page of it starts or settles, and no
    -- consumer leases it, before this transaction commits; with no open
    -- batch, its tick lock, so none is closed meanwhile. A page that starts
    -- after the commit finds the replayed effect heading its key
    -- (store.HeldKeys) and runs none of the key's effects. When the batch
    -- is leased (even past its expiry: its holder may still extend it),
    -- the page in flight may have read the key's state before the replay:
    -- the dead letter gets a barrier (pgoutbox.replay_barriers) that keeps
    -- the claim off it until that page settles, the lease is released or
    -- taken over, or it expires. Taken before the ordering locks: a settle
    -- waits for this transaction at its first statement, holding nothing,
    -- so its OnComplete transitions, which may take ordering locks, never
    -- wait for this transaction while it waits for their batch.
    FOR v_queue, v_slot IN
        SELECT DISTINCT e.queue, pgoutbox.stream_slot(e.ordering_key, e.id) FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
          AND (EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = e.queue AND s.storage = 'batch')
               OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = e.queue AND x.done_at IS NULL))
        ORDER BY 1, 2
    LOOP
        v_locked := false;
        LOOP
            SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.done_at IS NULL AND v_slot BETWEEN x.slot_lo AND x.slot_hi
            ORDER BY x.id LIMIT 1;
            IF NOT FOUND THEN
                PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || v_queue, 0));
                SELECT x.id INTO v_head FROM pgoutbox.stream_batches x
                WHERE x.queue = v_queue AND x.done_at IS NULL AND v_slot BETWEEN x.slot_lo AND x.slot_hi
                ORDER BY x.id LIMIT 1;
                EXIT WHEN NOT FOUND;
            END IF;
            SELECT x.* INTO v_batch FROM pgoutbox.stream_batches x
            WHERE x.queue = v_queue AND x.id = v_head AND x.done_at IS NULL
            FOR SHARE;
            IF FOUND THEN
                v_locked := true;
                EXIT;
            END IF;
        END LOOP;
        IF v_locked AND v_batch.lease_token IS NOT NULL THEN
            INSERT INTO pgoutbox.replay_barriers AS w (effect_id, queue, batch_id, lease_token, done_through)
            SELECT e.id, e.queue, v_batch.id, v_batch.lease_token, v_batch.done_through
            FROM pgoutbox.effects e
            WHERE e.id = ANY(v_ids) AND e.queue = v_queue AND e.ordering_key IS NOT NULL
              AND pgoutbox.stream_slot(e.ordering_key, e.id) = v_slot
              AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
            ON CONFLICT (effect_id) DO UPDATE
            SET queue = excluded.queue, batch_id = excluded.batch_id, lease_token = excluded.lease_token,
                done_through = excluded.done_through, created_at = now();
        END IF;
    END LOOP;

    -- The move-on dead letters among them: no new effect of their keys
    -- commits before this transaction does (pgoutbox.ordering_lock, in one
    -- canonical order) ...
    PERFORM pgoutbox.ordering_lock(array_agg(e.queue), array_agg(e.ordering_key))
    FROM pgoutbox.effects e
    WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
      AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type);

    -- ... and each key's first blocking effect after the dead letter is
    -- leased (the claim waits for it), not available, or available and
    -- locked here, after any claim transaction that held it has ended.
    FOR r IN
        SELECT e.id, e.queue, e.ordering_key FROM pgoutbox.effects e
        WHERE e.id = ANY(v_ids) AND e.ordering_key IS NOT NULL
          AND pgoutbox.dead_letter_moves_on(e.queue, e.effect_type)
        ORDER BY e.id
    LOOP
        LOOP
            SELECT p.id, p.state::text INTO v_next, v_state FROM pgoutbox.effects p
            WHERE p.queue = r.queue AND p.ordering_key = r.ordering_key AND p.id > r.id
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT pgoutbox.dead_letter_moves_on(p.queue, p.effect_type))
            ORDER BY p.id
            LIMIT 1;
            EXIT WHEN NOT FOUND OR v_state <> 'available';
            PERFORM 1 FROM pgoutbox.effects p WHERE p.id = v_next AND p.state::text = 'available' FOR KEY SHARE OF p;
            EXIT WHEN FOUND;
        END LOOP;
    END LOOP;

    RETURN QUERY
    WITH moved AS (
        UPDATE pgoutbox.effects e
        SET state = 'available', attempts = 0, available_at = now(),
            dead_lettered_at = NULL, delivery_started_at = NULL
        WHERE e.id = ANY(v_ids) AND e.state::text = 'dead_letter'
        RETURNING e.id, e.queue, e.effect_type, e.state::text AS state
    )
    SELECT m.id, m.queue, m.effect_type, m.state FROM moved m ORDER BY m.id;
END;
$$;

CREATE FUNCTION pgoutbox.retry_backoff(attempt integer, cap_seconds double precision) RETURNS double precision
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT least(least(power(2::float8, attempt), cap_seconds) * (1 + (random() * 0.2 - 0.1)), cap_seconds)
$$;

CREATE FUNCTION pgoutbox.revoke_enqueue(role_name text, queue text, effect_type text DEFAULT NULL::text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM pgoutbox.enqueue_grants g
    WHERE g.grantee = revoke_enqueue.role_name AND g.queue = revoke_enqueue.queue
      AND (revoke_enqueue.effect_type IS NULL OR g.effect_type = revoke_enqueue.effect_type);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

CREATE FUNCTION pgoutbox.revoke_work(role_name text, queue text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM pgoutbox.work_grants g WHERE g.grantee = revoke_work.role_name AND g.queue = revoke_work.queue;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;

CREATE FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[] DEFAULT '{}'::bigint[], outcomes text[] DEFAULT '{}'::text[], errors text[] DEFAULT '{}'::text[], retry_after interval[] DEFAULT '{}'::interval[], backoff_cap interval DEFAULT '00:05:00'::interval) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT s.settled FROM pgoutbox.settle_page(settle_batch.queue, settle_batch.batch_id,
        settle_batch.batch_token, settle_batch.through, settle_batch.worker, settle_batch.delivered,
        settle_batch.failed, settle_batch.outcomes, settle_batch.errors, settle_batch.retry_after, '{}',
        interval '30 seconds', settle_batch.backoff_cap) s);
END;
$$;

CREATE FUNCTION pgoutbox.settle_page(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[] DEFAULT '{}'::bigint[], outcomes text[] DEFAULT '{}'::text[], errors text[] DEFAULT '{}'::text[], retry_after interval[] DEFAULT '{}'::interval[], running bigint[] DEFAULT '{}'::bigint[], lease interval DEFAULT '00:00:30'::interval, backoff_cap interval DEFAULT '00:05:00'::interval, OUT settled boolean, OUT lease_ids bigint[], OUT lease_tokens uuid[]) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    b        pgoutbox.stream_batches;
    v_n      integer := coalesce(cardinality(settle_page.failed), 0);
    v_r      integer := coalesce(cardinality(settle_page.running), 0);
    v_page   pgoutbox.stream[];
    v_cap    float8;
    v_states text[];
    v_tries  integer[];
    v_delays float8[];
    v_firsts bigint[];
    v_bad    bigint;
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), settle_page.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(settle_page.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(settle_page.delivered IS NULL OR cardinality(settle_page.delivered) > 1000
        OR array_position(settle_page.delivered, NULL) IS NOT NULL, 'delivered',
        'must be an array of at most 1000 ids without NULL');
    PERFORM pgoutbox.work_refuse_bound(v_n > 1000 OR array_position(settle_page.failed, NULL) IS NOT NULL
        OR coalesce(cardinality(settle_page.outcomes), 0) <> v_n OR coalesce(cardinality(settle_page.errors), 0) <> v_n
        OR coalesce(cardinality(settle_page.retry_after), 0) NOT IN (0, v_n), 'failed',
        'outcomes, errors (and retry_after, unless empty) must be arrays of one length, at most 1000, ids without NULL');
    PERFORM pgoutbox.work_refuse_bound(v_r > 1000 OR array_position(settle_page.running, NULL) IS NOT NULL, 'running',
        'must be an array of at most 1000 ids without NULL');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (SELECT FROM unnest(settle_page.outcomes) o
        WHERE o IS NULL OR o NOT IN ('retry', 'retry_after', 'permanent', 'ambiguous', 'release')),
        'outcomes', 'must each be retry, retry_after, permanent, ambiguous or release');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (SELECT FROM unnest(settle_page.errors) e
        WHERE e IS NULL OR octet_length(e) > 65536), 'errors', 'must each be text of at most 65536 bytes');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (
        SELECT FROM unnest(settle_page.outcomes, CASE WHEN cardinality(settle_page.retry_after) = 0
            THEN array_fill(NULL::interval, ARRAY[v_n]) ELSE settle_page.retry_after END) AS f(o, ra)
        WHERE (f.o = 'retry_after') <> (f.ra IS NOT NULL) OR f.ra NOT BETWEEN interval '0' AND interval '1 day'),
        'retry_after', 'is required with outcome retry_after only, between 0 and 1 day');
    PERFORM pgoutbox.work_refuse_bound(settle_page.lease IS NULL
        OR settle_page.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_bound(settle_page.backoff_cap IS NULL
        OR settle_page.backoff_cap NOT BETWEEN interval '1 second' AND interval '1 day',
        'backoff_cap', 'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (
        SELECT x FROM unnest(settle_page.delivered || coalesce(settle_page.failed, '{}')
            || coalesce(settle_page.running, '{}')) x GROUP BY x HAVING count(*) > 1),
        'failed', 'must not repeat an id, nor name one that delivered or running names');
    SELECT x.* INTO b FROM pgoutbox.stream_batches x
    WHERE x.queue = settle_page.queue AND x.id = settle_page.batch_id AND x.lease_token = settle_page.batch_token
      AND x.done_at IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        settled := false;
        RETURN;
    END IF;
    PERFORM pgoutbox.work_refuse_bound(settle_page.through NOT BETWEEN b.done_through + 1 AND b.max_id, 'through',
        'must be the end of the page claim_batch returned');
    v_page := pgoutbox.stream_page_of(b, settle_page.through, 1001);
    PERFORM pgoutbox.work_refuse_bound(cardinality(v_page) > 1000, 'through',
        'spans more than 1000 effects: settle the page claim_batch returned');
    v_firsts := pgoutbox.stream_page_firsts(v_page);
    SELECT x INTO v_bad FROM unnest(settle_page.delivered || coalesce(settle_page.failed, '{}')
        || coalesce(settle_page.running, '{}')) x
    WHERE x <> ALL(v_firsts)
    LIMIT 1;
    PERFORM pgoutbox.work_refuse_bound(v_bad IS NOT NULL, 'delivered',
        format('names effect %s, which is not one claim_batch returned for this page', v_bad));
    -- pgoutbox.fail's routing of a replay-safe effect's first attempt.
    v_cap := extract(epoch FROM settle_page.backoff_cap);
    SELECT array_agg(CASE
            WHEN f.o = 'release' THEN 'available'
            WHEN f.o = 'permanent' OR p.max_attempts <= 1 THEN 'dead_letter'
            ELSE 'available' END ORDER BY f.ord),
        array_agg(CASE WHEN f.o = 'release' THEN 0 ELSE 1 END ORDER BY f.ord),
        array_agg(CASE
            WHEN f.o = 'release' OR f.o = 'permanent' OR p.max_attempts <= 1 THEN 0
            WHEN f.o = 'retry_after' THEN greatest(pgoutbox.retry_backoff(1, v_cap),
                least(extract(epoch FROM f.ra)::float8, greatest(3600, v_cap)))
            ELSE pgoutbox.retry_backoff(1, v_cap) END ORDER BY f.ord)
    INTO v_states, v_tries, v_delays
    FROM unnest(settle_page.failed, settle_page.outcomes, CASE WHEN cardinality(settle_page.retry_after) = 0
            THEN array_fill(NULL::interval, ARRAY[v_n]) ELSE settle_page.retry_after END)
        WITH ORDINALITY AS f(id, o, ra, ord)
    JOIN unnest(v_page) p ON p.id = f.id;
    -- Go's Move for a run still going at the cut: leased to the worker,
    -- its attempt counted, a token of its own.
    lease_ids := coalesce(settle_page.running, '{}');
    lease_tokens := ARRAY(SELECT gen_random_uuid() FROM generate_series(1, v_r));
    settled := pgoutbox.stream_settle_page(settle_page.queue, b.id, b.lease_token, settle_page.through,
        settle_page.through = b.max_id, settle_page.worker, v_page, settle_page.delivered,
        coalesce(settle_page.failed, '{}') || lease_ids,
        coalesce(v_states, '{}') || array_fill('leased'::text, ARRAY[v_r]),
        coalesce(v_tries, '{}') || array_fill(1, ARRAY[v_r]),
        coalesce(v_delays, '{}') || array_fill(0::float8, ARRAY[v_r]),
        ARRAY(SELECT CASE WHEN f.o = 'release' THEN '' ELSE f.e END
              FROM unnest(settle_page.outcomes, settle_page.errors) WITH ORDINALITY AS f(o, e, ord) ORDER BY f.ord)
            || array_fill(''::text, ARRAY[v_r]),
        array_fill(NULL::uuid, ARRAY[v_n]) || lease_tokens,
        extract(epoch FROM settle_page.lease)::float8);
END;
$$;

CREATE FUNCTION pgoutbox.stream_slot(p_ordering_key text, p_id bigint) RETURNS smallint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (CASE WHEN p_ordering_key IS NULL THEN p_id OPERATOR(pg_catalog.&) 255
                 ELSE pg_catalog.hashtextextended(p_ordering_key, 0) OPERATOR(pg_catalog.&) 255 END)::smallint
$$;

CREATE TABLE pgoutbox.stream (
    gen smallint NOT NULL,
    id bigint NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    queue text NOT NULL,
    effect_type text NOT NULL,
    idempotency_key text NOT NULL,
    payload json DEFAULT '{}'::json NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    traceparent text,
    slot smallint GENERATED ALWAYS AS (pgoutbox.stream_slot(ordering_key, id)) STORED NOT NULL,
    CONSTRAINT stream_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128))),
    CONSTRAINT stream_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (length(idempotency_key) <= 512))),
    CONSTRAINT stream_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT stream_ordering_key_check CHECK (((ordering_key <> ''::text) AND (octet_length(ordering_key) <= 512))),
    CONSTRAINT stream_payload_size CHECK ((octet_length(((payload)::jsonb)::text) <= 65536)),
    CONSTRAINT stream_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
)
PARTITION BY LIST (gen);

COMMENT ON TABLE pgoutbox.stream IS 'Effects of batch-storage queues, append-only, in three generations emptied by TRUNCATE (docs/batch-storage.md).';

COMMENT ON COLUMN pgoutbox.stream.payload IS 'The payload as the producer wrote it (json, migration 00036); its jsonb text is at most 65,536 bytes.';

CREATE FUNCTION pgoutbox.stream_after(p_queue text, p_snap pg_snapshot) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    AS $$
    SELECT r.* FROM pgoutbox.stream r
    WHERE r.queue = p_queue AND r.xid >= coalesce(pg_snapshot_xmax(p_snap), '1'::xid8)
    UNION ALL
    SELECT r.* FROM pgoutbox.stream r
    WHERE p_snap IS NOT NULL AND r.queue = p_queue AND r.xid = ANY (ARRAY(SELECT pg_snapshot_xip(p_snap)))
$$;

CREATE FUNCTION pgoutbox.stream_floor(p_queue text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_open bigint;
    v_snap pg_snapshot;
    v_new  bigint;
BEGIN
    SELECT min(b.done_through) + 1 INTO v_open
    FROM pgoutbox.stream_batches b WHERE b.queue = p_queue AND b.done_at IS NULL;
    SELECT b.snap INTO v_snap FROM pgoutbox.stream_batches b WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT min(s.id) INTO v_new FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND (s.xid >= coalesce(pg_snapshot_xmax(v_snap), '1'::xid8)
                                 OR s.xid = ANY (ARRAY(SELECT pg_snapshot_xip(v_snap))));
    RETURN least(v_open, v_new);
END;
$$;

CREATE FUNCTION pgoutbox.stream_floor_notify() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgoutbox.queue_storage q
               WHERE q.queue = NEW.queue AND q.storage = 'rows' AND q.left_batch_at IS NOT NULL) THEN
        PERFORM pg_notify('pgoutbox_effects', NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.stream_gen() RETURNS smallint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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

CREATE FUNCTION pgoutbox.stream_maintain(p_rotate_after interval, p_retention interval) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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
                        OR (EXISTS (SELECT 1 FROM pgoutbox.stream_batches b
                                    WHERE b.queue = q.queue AND pg_visible_in_snapshot(g.closed_xid, b.snap))
                            AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream_batches o
                                            WHERE o.queue = q.queue AND o.done_at IS NULL
                                              AND (o.prev_snap IS NULL
                                                   OR NOT pg_visible_in_snapshot(g.closed_xid, o.prev_snap)))))
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

    -- Settled batches but the newest of each queue's slot range: it tells
    -- that the range's earlier rows are settled (pgoutbox.effect_states),
    -- and the newest batch, kept so, is the next tick's lower bound.
    DELETE FROM pgoutbox.stream_batches b
    WHERE b.done_at IS NOT NULL
      AND b.id < (SELECT max(l.id) FROM pgoutbox.stream_batches l
                  WHERE l.queue = b.queue AND l.slot_lo = b.slot_lo AND l.slot_hi = b.slot_hi AND l.done_at IS NOT NULL);
    RETURN v_n;
END;
$$;

CREATE TABLE pgoutbox.stream_batches (
    queue text NOT NULL,
    id bigint NOT NULL,
    snap pg_snapshot NOT NULL,
    prev_snap pg_snapshot,
    min_id bigint NOT NULL,
    max_id bigint NOT NULL,
    effects bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_token uuid,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    done_through bigint NOT NULL,
    done_at timestamp with time zone,
    type_names text[],
    type_effects bigint[],
    type_available_at timestamp with time zone[],
    type_passed bigint[],
    slot_lo smallint DEFAULT 0 NOT NULL,
    slot_hi smallint DEFAULT 255 NOT NULL,
    chunk_types text[],
    chunk_ends bigint[],
    chunk_available_at timestamp with time zone[],
    CONSTRAINT stream_batches_lease_owner_check CHECK ((length(lease_owner) <= 256)),
    CONSTRAINT stream_batches_slots CHECK ((((slot_lo >= 0) AND (slot_lo <= slot_hi)) AND (slot_hi <= 255)))
);

COMMENT ON TABLE pgoutbox.stream_batches IS 'Batches of the stream per queue, in tick order: snapshots, fenced lease, settled position (docs/batch-storage.md).';

COMMENT ON COLUMN pgoutbox.stream_batches.type_names IS 'The effect types of the batch (NULL: ticked before migration 00030); type_effects, type_available_at and type_passed are aligned with it.';

COMMENT ON COLUMN pgoutbox.stream_batches.slot_lo IS 'The batch''s lane: the stream rows whose slot is between slot_lo and slot_hi (migration 00031).';

COMMENT ON COLUMN pgoutbox.stream_batches.chunk_types IS 'Per effect type and chunk of 1,024 ids of the batch (NULL: ticked before migration 00035): the type; chunk_ends holds the chunk''s last id, chunk_available_at its earliest available_at.';

CREATE FUNCTION pgoutbox.stream_next_batch(p_queue text) RETURNS SETOF pgoutbox.stream_batches
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$BEGIN
RETURN QUERY
SELECT b.* FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue AND b.done_at IS NULL
      AND (b.lease_token IS NULL OR b.lease_expires_at < now())
      AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.stream_batches x
        WHERE x.queue = p_queue AND x.done_at IS NULL AND x.id < b.id
          AND x.slot_lo <= b.slot_hi AND b.slot_lo <= x.slot_hi)
    ORDER BY b.id
    LIMIT 1
    FOR UPDATE OF b SKIP LOCKED;
END;$$;

CREATE FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot, p_prev pg_snapshot, p_limit integer) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_bitmapscan TO 'off'
    SET enable_seqscan TO 'off'
    SET enable_sort TO 'off'
    AS $$
    SELECT s.* FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND s.id > p_after AND s.id <= p_max_id
      AND pg_visible_in_snapshot(s.xid, p_snap)
      AND (p_prev IS NULL OR NOT pg_visible_in_snapshot(s.xid, p_prev))
    ORDER BY s.id
    LIMIT p_limit
$$;

CREATE FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot, p_prev pg_snapshot, p_limit integer, p_slot_lo smallint, p_slot_hi smallint) RETURNS SETOF pgoutbox.stream
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_bitmapscan TO 'off'
    SET enable_seqscan TO 'off'
    SET enable_sort TO 'off'
    AS $$
    SELECT s.* FROM pgoutbox.stream s
    WHERE s.queue = p_queue AND s.id > p_after AND s.id <= p_max_id AND s.slot >= p_slot_lo AND s.slot <= p_slot_hi
      AND pg_visible_in_snapshot(s.xid, p_snap)
      AND (p_prev IS NULL OR NOT pg_visible_in_snapshot(s.xid, p_prev))
    ORDER BY s.id
    LIMIT p_limit
$$;

CREATE FUNCTION pgoutbox.stream_page_firsts(p_page pgoutbox.stream[]) RETURNS bigint[]
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(f.id ORDER BY f.id), '{}')
        FROM (SELECT p.id, p.ordering_key, row_number() OVER (PARTITION BY p.ordering_key ORDER BY p.id) AS rn
              FROM unnest(p_page) p) f
        WHERE f.ordering_key IS NULL OR f.rn = 1);
END;
$$;

CREATE FUNCTION pgoutbox.stream_page_of(b pgoutbox.stream_batches, p_through bigint, p_limit integer) RETURNS pgoutbox.stream[]
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(p ORDER BY p.id), '{}')
        FROM pgoutbox.stream_page(b.queue, b.done_through, p_through, b.snap, b.prev_snap, p_limit, b.slot_lo,
            b.slot_hi) p);
END;
$$;

CREATE FUNCTION pgoutbox.stream_passed(p_names text[], p_passed bigint[], p_add_names text[], p_add bigint[]) RETURNS bigint[]
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN p_names IS NOT NULL THEN (
        SELECT array_agg(t.n + coalesce((SELECT sum(a.n) FROM unnest(p_add_names, p_add) AS a(name, n)
                                         WHERE a.name = t.name), 0)::bigint ORDER BY t.i)
        FROM unnest(p_names, p_passed) WITH ORDINALITY AS t(name, n, i))
    END
$$;

CREATE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint, p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[], p_attempts integer[], p_delays double precision[], p_errors text[]) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN pgoutbox.stream_settle_page(p_queue, p_batch, p_token, p_through, p_last, p_worker, p_page, p_done,
        p_ids, p_states, p_attempts, p_delays, p_errors, '{}'::uuid[], 0::float8);
END;
$$;

CREATE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint, p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[], p_attempts integer[], p_delays double precision[], p_errors text[], p_tokens uuid[], p_lease_s double precision) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_types  text[];
    v_counts bigint[];
    v_p50    float8[];
    v_p99    float8[];
    v_moves  bigint[];
    v_states text[];
    v_tries  integer[];
    v_delays float8[];
    v_errors text[];
    v_tokens uuid[];
BEGIN
    SELECT array_agg(t.effect_type), array_agg(t.n) INTO v_types, v_counts
    FROM (SELECT p.effect_type, count(*) AS n FROM unnest(p_page) p GROUP BY p.effect_type) t;
    IF NOT EXISTS (SELECT FROM pgoutbox.work_settle_batch_row(p_queue, p_batch, p_token, p_through, p_last,
            coalesce(v_types, '{}'), coalesce(v_counts, '{}'))) THEN
        RETURN false;
    END IF;
    SELECT array_agg(t.effect_type), array_agg(t.n), array_agg(t.p50), array_agg(t.p99)
    INTO v_types, v_counts, v_p50, v_p99
    FROM (
        SELECT p.effect_type, count(*) AS n,
            percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM now() - p.created_at)::float8) AS p50,
            percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM now() - p.created_at)::float8) AS p99
        FROM unnest(p_page) p WHERE p.id = ANY(p_done)
        GROUP BY p.effect_type) t;
    IF v_types IS NOT NULL THEN
        PERFORM pgoutbox.work_page_settled(p_queue, v_types, v_counts, v_p50, v_p99);
    END IF;
    SELECT array_agg(p.id ORDER BY p.id), array_agg(coalesce(f.state, 'available') ORDER BY p.id),
        array_agg(coalesce(f.attempts, 0) ORDER BY p.id), array_agg(coalesce(f.delay_s, 0) ORDER BY p.id),
        array_agg(coalesce(f.error, '') ORDER BY p.id), array_agg(f.token ORDER BY p.id)
    INTO v_moves, v_states, v_tries, v_delays, v_errors, v_tokens
    FROM unnest(p_page) p
    LEFT JOIN unnest(p_ids, p_states, p_attempts, p_delays, p_errors, p_tokens)
        AS f(id, state, attempts, delay_s, error, token) ON f.id = p.id
    WHERE p.id <> ALL(p_done);
    IF v_moves IS NOT NULL THEN
        PERFORM pgoutbox.work_move_rows(v_moves, v_states, v_tries, v_delays, v_errors, p_worker, p_queue,
            v_tokens, array_fill(p_lease_s, ARRAY[cardinality(v_moves)]));
    END IF;
    IF NOT p_last THEN
        PERFORM pgoutbox.work_release_batch(p_queue, p_batch, p_token);
    END IF;
    RETURN true;
END;
$$;

CREATE FUNCTION pgoutbox.stream_tick(p_queue text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_last  bigint;
    v_prev  pg_snapshot;
    v_snap  pg_snapshot;
    v_lanes integer;
    v_n     bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgoutbox: stream_tick must run under READ COMMITTED'
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('pgoutbox.stream_tick.' || p_queue, 0));
    SELECT b.id, b.snap INTO v_last, v_prev FROM pgoutbox.stream_batches b
    WHERE b.queue = p_queue ORDER BY b.id DESC LIMIT 1;
    SELECT pg_current_snapshot() INTO v_snap; -- a query: a fresh snapshot, taken after the lock
    SELECT coalesce((SELECT q.lanes FROM pgoutbox.queue_storage q WHERE q.queue = p_queue), 1) INTO v_lanes;
    -- A row is new when its transaction committed in v_snap and not in
    -- v_prev: its xid is at or past v_prev's xmax, or was in progress then.
    -- Lane l holds the slots s with s * lanes / 256 = l: from
    -- ceil(256 l / lanes) to ceil(256 (l + 1) / lanes) - 1.
    -- Each (lane, type) also gets its earliest available_at per chunk of
    -- 1,024 ids (chunk_*), for status of a batch partially settled.
    INSERT INTO pgoutbox.stream_batches (queue, id, snap, prev_snap, min_id, max_id, effects, done_through,
        type_names, type_effects, type_available_at, type_passed, slot_lo, slot_hi,
        chunk_types, chunk_ends, chunk_available_at)
    WITH c AS (
        -- The chunk first: the rows come about in id order, which the
        -- grouping's sort then finds nearly done.
        SELECT s.id >> 10 AS chunk, s.slot * v_lanes / 256 AS lane, s.effect_type, min(s.id) AS lo, max(s.id) AS hi,
            count(*) AS n, min(s.available_at) AS avail
        FROM pgoutbox.stream_after(p_queue, v_prev) s
        WHERE pg_visible_in_snapshot(s.xid, v_snap)
        GROUP BY 1, 2, 3
    )
    SELECT p_queue, coalesce(v_last, 0) + row_number() OVER (ORDER BY l.lane), v_snap, v_prev, l.lo, l.hi, l.n,
        l.lo - 1, l.names, l.counts, l.avail, array_fill(0::bigint, ARRAY[cardinality(l.names)]),
        ((256 * l.lane + v_lanes - 1) / v_lanes)::smallint, ((256 * (l.lane + 1) + v_lanes - 1) / v_lanes - 1)::smallint,
        k.types, k.ends, k.avail
    FROM (
        SELECT t.lane, min(t.lo) AS lo, max(t.hi) AS hi, sum(t.n)::bigint AS n, array_agg(t.effect_type ORDER BY t.effect_type)
            AS names, array_agg(t.n ORDER BY t.effect_type) AS counts, array_agg(t.avail ORDER BY t.effect_type) AS avail
        FROM (
            SELECT c.lane, c.effect_type, min(c.lo) AS lo, max(c.hi) AS hi, sum(c.n)::bigint AS n, min(c.avail) AS avail
            FROM c
            GROUP BY 1, 2
        ) t
        GROUP BY t.lane
    ) l
    JOIN (
        SELECT c.lane, array_agg(c.effect_type ORDER BY c.effect_type, c.chunk) AS types,
            array_agg((c.chunk << 10) + 1023 ORDER BY c.effect_type, c.chunk) AS ends,
            array_agg(c.avail ORDER BY c.effect_type, c.chunk) AS avail
        FROM c
        GROUP BY c.lane
    ) k ON k.lane = l.lane;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN NULL;
    END IF;
    RETURN coalesce(v_last, 0) + 1;
END;
$$;

CREATE FUNCTION pgoutbox.stream_to_rows(p_queue text, p_max integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    b       pgoutbox.stream_batches;
    v_n     integer;
    v_last  bigint;
    v_moved integer := 0;
    v_names text[];
    v_add   bigint[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = p_queue AND s.storage = 'batch')
       AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream x WHERE x.queue = p_queue) THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = p_queue) THEN
        RETURN 0;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgoutbox.stream_tick(p_queue);
    END IF;
    -- Batch after batch, each the oldest a consumer may lease
    -- (stream_next_batch), until p_max effects moved.
    WHILE v_moved < p_max LOOP
        SELECT x.* INTO b FROM pgoutbox.stream_next_batch(p_queue) x;
        IF NOT FOUND THEN
            EXIT;
        END IF;
        WITH page AS (
            SELECT * FROM pgoutbox.stream_page(p_queue, b.done_through, b.max_id, b.snap, b.prev_snap, p_max - v_moved,
                b.slot_lo, b.slot_hi)
        ), marked AS (
            SELECT set_config('pgoutbox.keys_written', 'on', true) AS m, set_config('pgoutbox.routed', 'on', true) AS r
        ), moved AS (
            INSERT INTO pgoutbox.effects (id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
                created_at, ordering_key, traceparent)
            OVERRIDING SYSTEM VALUE
            SELECT p.id, p.queue, p.effect_type, p.idempotency_key, p.payload, p.max_attempts, p.available_at,
                p.created_at, p.ordering_key, p.traceparent
            FROM page p CROSS JOIN marked
            ORDER BY p.id
            RETURNING id, effect_type
        ), per_type AS (
            SELECT m.effect_type, count(*) AS n, max(m.id) AS last FROM moved m GROUP BY m.effect_type
        )
        SELECT coalesce(sum(t.n), 0), max(t.last), array_agg(t.effect_type), array_agg(t.n)
        INTO v_n, v_last, v_names, v_add FROM per_type t;
        IF v_n = 0 THEN
            -- effect_keys_insert did not fire: clear the markers here.
            PERFORM set_config('pgoutbox.keys_written', 'off', true), set_config('pgoutbox.routed', 'off', true);
        END IF;
        v_moved := v_moved + v_n;
        IF v_moved < p_max OR v_last = b.max_id THEN
            -- The batch's last page: it is done.
            UPDATE pgoutbox.stream_batches x
            SET done_through = x.max_id, done_at = now(), lease_token = NULL, lease_owner = NULL,
                lease_expires_at = NULL, type_passed = pgoutbox.stream_passed(x.type_names, x.type_passed, v_names, v_add)
            WHERE x.queue = p_queue AND x.id = b.id;
        ELSE
            UPDATE pgoutbox.stream_batches x
            SET done_through = v_last, lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
                type_passed = pgoutbox.stream_passed(x.type_names, x.type_passed, v_names, v_add)
            WHERE x.queue = p_queue AND x.id = b.id;
        END IF;
    END LOOP;
    RETURN v_moved;
END;
$$;

CREATE FUNCTION pgoutbox.unpark_next() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE pgoutbox.effects e
    SET available_at = e.parked_due_at, parked_due_at = NULL
    WHERE e.id = (
            SELECT p.id FROM pgoutbox.effects p
            WHERE p.queue = NEW.queue AND p.ordering_key = NEW.ordering_key
              AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
              AND (p.state <> 'dead_letter' OR NOT coalesce(
                    (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
                     WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
                    (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
                     WHERE t.effect_type = p.effect_type),
                    false))
            ORDER BY p.id
            LIMIT 1)
      AND e.parked_due_at IS NOT NULL;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgoutbox.work_claim_batch(text, text, double precision) RETURNS TABLE(r_id bigint, r_snap text, r_prev_snap text, r_min_id bigint, r_max_id bigint, r_effects bigint, r_done_through bigint, r_token uuid, r_relet boolean, r_slot_lo smallint, r_slot_hi smallint)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
RETURN QUERY
WITH head AS (
    SELECT b.id, b.lease_token IS NOT NULL AS relet FROM pgoutbox.stream_next_batch($1) b
    WHERE NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
)
UPDATE pgoutbox.stream_batches b
FROM head
WHERE b.queue = $1 AND b.id = head.id AND b.done_at IS NULL
  AND (b.lease_token IS NULL OR b.lease_expires_at < now())
RETURNING b.id, b.snap::text, b.prev_snap::text, b.min_id, b.max_id, b.effects, b.done_through, b.lease_token,
    head.relet, b.slot_lo, b.slot_hi;
END;
$_$;

CREATE FUNCTION pgoutbox.work_claim_rows(text, integer, text, double precision, integer) RETURNS TABLE(r_id bigint, r_queue text, r_effect_type text, r_key text, r_payload jsonb, r_attempts integer, r_max_attempts integer, r_token uuid, r_created_at timestamp with time zone, r_latency double precision, r_delivery_started_at timestamp with time zone, r_ordering_key text, r_traceparent text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
WITH next AS (SELECT id 
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
      AND (e.ordering_key IS NULL OR (e.id < coalesce((
        SELECT pgoutbox.stream_floor(qs.queue) FROM pgoutbox.queue_storage qs
        WHERE qs.queue = $1 AND qs.storage = 'rows' AND qs.left_batch_at IS NOT NULL), 9223372036854775807) AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id < e.id
          AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
          AND (p.state <> 'dead_letter' OR NOT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p.effect_type),
        false))) AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id > e.id
          AND p.ordering_key IS NOT NULL AND p.state = 'leased') AND NOT EXISTS (
        SELECT 1 FROM pgoutbox.replay_barriers w
        JOIN pgoutbox.stream_batches b ON b.queue = w.queue AND b.id = w.batch_id
        WHERE w.effect_id = e.id AND b.done_at IS NULL AND b.done_through = w.done_through
          AND b.lease_token = w.lease_token AND b.lease_expires_at >= now())))
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
    lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = statement_timestamp() + make_interval(secs => $4)
WHERE e.id = ANY(ARRAY(SELECT id FROM next))
RETURNING e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts,
    e.lease_token, e.created_at, extract(epoch FROM now() - e.available_at)::float8, e.delivery_started_at,
    coalesce(e.ordering_key, ''), coalesce(e.traceparent, '')
$_$;

CREATE FUNCTION pgoutbox.work_complete_rows(bigint[], uuid[], text[]) RETURNS TABLE(r_id bigint, r_token uuid, r_effect_type text, r_lag double precision)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
WITH fenced AS (
    SELECT x.id, f.token, f.effect_type
    FROM (SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS u(id, token, effect_type) ORDER BY id) f
    CROSS JOIN LATERAL (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.id = f.id AND e.state::text = 'leased' AND e.lease_token = f.token AND e.effect_type = f.effect_type
        FOR UPDATE
    ) x
), done AS (
    UPDATE pgoutbox.effects e
    SET state = 'completed', completed_at = now(), lease_token = NULL, lease_expires_at = NULL, last_error = NULL
    WHERE e.id = ANY(ARRAY(SELECT id FROM fenced))
    RETURNING e.id, extract(epoch FROM now() - e.created_at)::float8 AS lag
)
SELECT d.id, f.token, f.effect_type, d.lag FROM done d JOIN fenced f ON f.id = d.id
$_$;

CREATE FUNCTION pgoutbox.work_extend_batch(text, bigint, uuid, double precision) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches SET lease_expires_at = now() + make_interval(secs => $4)
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$_$;

CREATE FUNCTION pgoutbox.work_extend_rows(bigint[], uuid[], text[], double precision) RETURNS TABLE(r_id bigint, r_token uuid, r_effect_type text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
WITH f AS (
    SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS u(id, token, effect_type) ORDER BY id
), held AS (
    -- LIMIT 1 keeps the subquery from being flattened into a hash join
    -- over the whole table: one primary-key probe per fence.
    SELECT x.id, f.token, f.effect_type FROM f
    CROSS JOIN LATERAL (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.id = f.id AND e.state::text = 'leased' AND e.lease_token = f.token AND e.effect_type = f.effect_type
        LIMIT 1
    ) x
), locked AS (
    SELECT x.id, f.token, f.effect_type FROM f
    CROSS JOIN LATERAL (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.id = f.id AND e.state::text = 'leased' AND e.lease_token = f.token AND e.effect_type = f.effect_type
        FOR UPDATE SKIP LOCKED
    ) x
), extended AS (
    UPDATE pgoutbox.effects e
    SET lease_expires_at = now() + make_interval(secs => $4)
    WHERE e.id = ANY(ARRAY(SELECT id FROM locked))
    RETURNING e.id
)
SELECT id, token, effect_type FROM held
UNION
SELECT l.id, l.token, l.effect_type FROM locked l WHERE l.id IN (SELECT id FROM extended)
$_$;

CREATE FUNCTION pgoutbox.work_fail_row(bigint, uuid, text, text, double precision, text) RETURNS SETOF text
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
WITH target AS (
    SELECT id, attempts, max_attempts, delivery_started_at,
        (CASE
            WHEN $4 = 'release' THEN pgoutbox.recovered_state(delivery_started_at, attempts, max_attempts)::text
            WHEN $4 = 'reconcile' THEN 'reconciliation_required'
            WHEN $4 = 'dead_letter' OR ($4 = 'retry' AND attempts >= max_attempts) THEN 'dead_letter'
            ELSE 'available'
        END)::pgoutbox.effect_state AS next_state
    FROM pgoutbox.effects
    WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3
    FOR UPDATE
)
UPDATE pgoutbox.effects e
    available_at = CASE WHEN t.next_state = 'available' THEN now() + make_interval(secs => $5) ELSE e.available_at END,
    dead_lettered_at = CASE WHEN t.next_state = 'dead_letter' THEN now() END,
    reconciliation_at = CASE WHEN t.next_state = 'reconciliation_required' THEN now() END,
    delivery_started_at = CASE WHEN t.next_state = 'available' THEN NULL ELSE e.delivery_started_at END,
    lease_token = NULL, lease_expires_at = NULL, last_error = left($6, 2000)
FROM target t
WHERE e.id = t.id
RETURNING e.state::text
$_$;

CREATE FUNCTION pgoutbox.work_held_keys(text, text[]) RETURNS SETOF text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
RETURN QUERY
SELECT k FROM unnest($2::text[]) AS k
WHERE EXISTS (
    SELECT 1 FROM pgoutbox.effects p
    WHERE p.queue = $1 AND p.ordering_key = k AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
      AND (p.state <> 'dead_letter' OR NOT coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p.effect_type),
        false)));
END;
$_$;

CREATE FUNCTION pgoutbox.work_move_rows(bigint[], text[], integer[], double precision[], text[], text, text, uuid[], double precision[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
WITH input AS (
    SELECT m.* FROM unnest($1::bigint[], $2::text[], $3::int[], $4::float8[], $5::text[], $8::uuid[], $9::float8[])
        AS m(id, state, attempts, delay_s, error, token, lease_s)
), marked AS (
    SELECT set_config('pgoutbox.keys_written', 'on', true) AS m, set_config('pgoutbox.routed', 'on', true) AS r
), moved AS (
    INSERT INTO pgoutbox.effects (id, queue, effect_type, idempotency_key, payload, state, attempts, max_attempts,
        available_at, created_at, ordering_key, traceparent, last_error, dead_lettered_at, lease_token, lease_owner,
        leased_at, lease_expires_at)
    OVERRIDING SYSTEM VALUE
    SELECT s.id, s.queue, s.effect_type, s.idempotency_key, s.payload, i.state::pgoutbox.effect_state, i.attempts,
        s.max_attempts,
        CASE WHEN i.attempts = 0 THEN s.available_at ELSE now() + make_interval(secs => i.delay_s) END,
        s.created_at, s.ordering_key, s.traceparent, left(i.error, 2000),
        CASE WHEN i.state = 'dead_letter' THEN now() END,
        CASE WHEN i.state = 'leased' THEN i.token END, CASE WHEN i.state = 'leased' THEN $6 END,
        CASE WHEN i.state = 'leased' THEN now() END,
        CASE WHEN i.state = 'leased' THEN statement_timestamp() + make_interval(secs => i.lease_s) END
    FROM input i JOIN pgoutbox.stream s ON s.queue = $7 AND s.id = i.id CROSS JOIN marked
    ORDER BY s.id
    RETURNING id
)
INSERT INTO pgoutbox.effect_attempts (effect_id, attempt, outcome, error, worker)
SELECT i.id, i.attempts, CASE WHEN i.state = 'available' THEN 'retrying' ELSE i.state END, left(i.error, 2000),
    left($6, 256)
FROM input i JOIN moved m ON m.id = i.id
WHERE i.attempts > 0 AND i.state <> 'leased';
END;
$_$;

CREATE FUNCTION pgoutbox.work_page_settled(text, text[], bigint[], double precision[], double precision[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
INSERT INTO pgoutbox.stream_settled (queue, effect_type, completed, lag_p50, lag_p99)
SELECT $1, t.* FROM unnest($2::text[], $3::bigint[], $4::float8[], $5::float8[]) AS t;
END;
$_$;

CREATE FUNCTION pgoutbox.work_refuse_bound(p_bad boolean, p_column text, p_message text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_bad IS NOT FALSE THEN
        RAISE EXCEPTION 'pgoutbox: invalid argument: % %', p_column, p_message
            USING ERRCODE = 'OB001', COLUMN = p_column;
    END IF;
END;
$$;

CREATE FUNCTION pgoutbox.work_refuse_fences(p_role name, p_ids bigint[], p_tokens uuid[]) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v_queue text;
BEGIN
    IF has_table_privilege(p_role, 'pgoutbox.effects', 'UPDATE') THEN
        RETURN;
    END IF;
    IF NOT EXISTS (
        SELECT FROM pgoutbox.work_grants g JOIN pg_roles r ON r.rolname = g.grantee
        WHERE pg_has_role(p_role, r.oid, 'USAGE')) THEN
        RAISE EXCEPTION 'pgoutbox: role "%" may not work any queue (the owner grants it with pgoutbox.grant_work)', p_role
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT e.queue INTO v_queue
    FROM unnest(p_ids, p_tokens) AS f(id, token)
    JOIN pgoutbox.effects e ON e.id = f.id AND e.lease_token = f.token
    WHERE NOT pgoutbox.may_work(p_role, e.queue)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgoutbox: role "%" may not work queue "%" (the owner grants it with pgoutbox.grant_work)',
            p_role, v_queue
            USING ERRCODE = 'insufficient_privilege', COLUMN = 'queue';
    END IF;
END;
$$;

CREATE FUNCTION pgoutbox.work_refuse_queue(p_role name, p_queue text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NOT coalesce(pgoutbox.may_work(p_role, p_queue), false) THEN
        RAISE EXCEPTION 'pgoutbox: role "%" may not work queue "%" (the owner grants it with pgoutbox.grant_work)',
            p_role, p_queue
            USING ERRCODE = 'insufficient_privilege', COLUMN = 'queue';
    END IF;
END;
$$;

CREATE FUNCTION pgoutbox.work_release_batch(text, bigint, uuid) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$_$;

CREATE FUNCTION pgoutbox.work_settle_batch_row(text, bigint, uuid, bigint, boolean, text[], bigint[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches
    lease_token = CASE WHEN $5 THEN NULL ELSE lease_token END,
    lease_expires_at = CASE WHEN $5 THEN NULL ELSE lease_expires_at END,
    type_passed = pgoutbox.stream_passed(type_names, type_passed, $6::text[], $7::bigint[])
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$_$;

CREATE FUNCTION pgoutbox.work_start_row(bigint, uuid, text) RETURNS SETOF bigint
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
UPDATE pgoutbox.effects SET delivery_started_at = now()
WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3
  AND lease_expires_at > now()
RETURNING id
$_$;

CREATE FUNCTION pgoutbox.work_sweep_rows(integer, double precision, text) RETURNS TABLE(r_id bigint, r_queue text, r_effect_type text, r_state text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
WITH expired AS (
    SELECT id FROM pgoutbox.effects
    WHERE state = 'leased' AND lease_expires_at < now() - make_interval(secs => $2)
      AND ($3::text IS NULL OR queue = $3)
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE pgoutbox.effects e
    available_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'available'
        THEN now() ELSE e.available_at END,
    dead_lettered_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'dead_letter'
        THEN now() END,
    reconciliation_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'reconciliation_required'
        THEN now() END,
    lease_token = NULL, lease_expires_at = NULL,
    last_error = 'lease expired (owner ' || coalesce(e.lease_owner, '?') || ')'
FROM expired x
WHERE e.id = x.id AND e.state::text = 'leased'
RETURNING e.id, e.queue, e.effect_type, e.state::text
$_$;

CREATE TABLE pgoutbox.console_audit (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    operator text NOT NULL,
    session text NOT NULL,
    action text NOT NULL,
    target text DEFAULT ''::text NOT NULL,
    changed integer DEFAULT 0 NOT NULL,
    outcome text DEFAULT ''::text NOT NULL,
    CONSTRAINT console_audit_action_check CHECK (((action <> ''::text) AND (length(action) <= 64))),
    CONSTRAINT console_audit_changed_check CHECK ((changed >= 0)),
    CONSTRAINT console_audit_operator_check CHECK ((length(operator) <= 200)),
    CONSTRAINT console_audit_outcome_check CHECK ((length(outcome) <= 2000)),
    CONSTRAINT console_audit_session_check CHECK ((length(session) <= 64)),
    CONSTRAINT console_audit_target_check CHECK ((length(target) <= 1000))
);

ALTER TABLE pgoutbox.console_audit ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgoutbox.console_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE pgoutbox.effect_attempts (
    effect_id bigint NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    outcome text NOT NULL,
    error text,
    worker text,
    CONSTRAINT effect_attempts_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT effect_attempts_error_check CHECK ((length(error) <= 2000)),
    CONSTRAINT effect_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['retrying'::text, 'dead_letter'::text, 'reconciliation_required'::text, 'replayed'::text]))),
    CONSTRAINT effect_attempts_worker_check CHECK ((length(worker) <= 256))
);

COMMENT ON TABLE pgoutbox.effect_attempts IS 'Failed attempts (and replays) of each effect, oldest first by seq; deleted with the effect (docs/console.md).';

ALTER TABLE pgoutbox.effect_attempts ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgoutbox.effect_attempts_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE pgoutbox.effect_keys (
    queue text NOT NULL,
    idempotency_key text NOT NULL,
    effect_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE pgoutbox.effects (
    id bigint NOT NULL,
    queue text NOT NULL,
    effect_type text NOT NULL,
    idempotency_key text NOT NULL,
    payload jsonb DEFAULT '{}'::jsonb NOT NULL,
    state pgoutbox.effect_state DEFAULT 'available'::pgoutbox.effect_state NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    leased_at timestamp with time zone,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    delivery_started_at timestamp with time zone,
    completed_at timestamp with time zone,
    dead_lettered_at timestamp with time zone,
    reconciliation_at timestamp with time zone,
    last_error text,
    resolution jsonb,
    ordering_key text,
    parked_due_at timestamp with time zone,
    traceparent text,
    CONSTRAINT effects_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT effects_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128))),
    CONSTRAINT effects_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (length(idempotency_key) <= 512))),
    CONSTRAINT effects_lease_consistent CHECK (((state = 'leased'::pgoutbox.effect_state) = ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT effects_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT effects_ordering_key_check CHECK (((ordering_key <> ''::text) AND (octet_length(ordering_key) <= 512))),
    CONSTRAINT effects_payload_size CHECK ((octet_length((payload)::text) <= 65536)),
    CONSTRAINT effects_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
);

CREATE VIEW pgoutbox.effect_states AS
 SELECT e.id,
    e.queue,
    e.effect_type,
    e.idempotency_key,
    e.payload,
    e.state,
    e.attempts,
    e.max_attempts,
    e.available_at,
    e.created_at,
    e.lease_token,
    e.lease_expires_at,
    e.delivery_started_at,
    e.completed_at,
    e.last_error,
    e.ordering_key,
    'rows'::text AS storage
   FROM pgoutbox.effects e
UNION ALL
 SELECT s.id,
    s.queue,
    s.effect_type,
    s.idempotency_key,
    (s.payload)::jsonb AS payload,
    st.state,
        CASE
            WHEN (st.state = 'available'::pgoutbox.effect_state) THEN 0
            ELSE 1
        END AS attempts,
    s.max_attempts,
    s.available_at,
    s.created_at,
        CASE
            WHEN (st.state = 'leased'::pgoutbox.effect_state) THEN b.lease_token
            ELSE NULL::uuid
        END AS lease_token,
        CASE
            WHEN (st.state = 'leased'::pgoutbox.effect_state) THEN b.lease_expires_at
            ELSE NULL::timestamp with time zone
        END AS lease_expires_at,
    NULL::timestamp with time zone AS delivery_started_at,
        CASE
            WHEN (st.state = 'completed'::pgoutbox.effect_state) THEN b.done_at
            ELSE NULL::timestamp with time zone
        END AS completed_at,
    NULL::text AS last_error,
    s.ordering_key,
    'batch'::text AS storage
   FROM (((pgoutbox.stream s
     LEFT JOIN LATERAL ( SELECT b_1.queue,
            b_1.id,
            b_1.snap,
            b_1.prev_snap,
            b_1.min_id,
            b_1.max_id,
            b_1.effects,
            b_1.created_at,
            b_1.lease_token,
            b_1.lease_owner,
            b_1.lease_expires_at,
            b_1.done_through,
            b_1.done_at,
            b_1.type_names,
            b_1.type_effects,
            b_1.type_available_at,
            b_1.type_passed,
            b_1.slot_lo,
            b_1.slot_hi,
            b_1.chunk_types,
            b_1.chunk_ends,
            b_1.chunk_available_at
           FROM pgoutbox.stream_batches b_1
          WHERE ((b_1.queue = s.queue) AND ((s.slot >= b_1.slot_lo) AND (s.slot <= b_1.slot_hi)) AND pg_visible_in_snapshot(s.xid, b_1.snap) AND ((b_1.done_at IS NOT NULL) OR (b_1.prev_snap IS NULL) OR (NOT pg_visible_in_snapshot(s.xid, b_1.prev_snap))))
          ORDER BY b_1.id
         LIMIT 1) b ON (true))
     CROSS JOIN LATERAL ( SELECT (
                CASE
                    WHEN ((b.done_at IS NOT NULL) OR (b.done_through >= s.id)) THEN 'completed'::text
                    WHEN ((b.lease_token IS NOT NULL) AND (b.lease_expires_at > now())) THEN 'leased'::text
                    ELSE 'available'::text
                END)::pgoutbox.effect_state AS state) st)
     LEFT JOIN LATERAL ( SELECT true AS moved
           FROM pgoutbox.effects m
          WHERE (m.id = s.id)
         LIMIT 1) mv ON (true))
  WHERE (mv.moved IS NULL);

COMMENT ON VIEW pgoutbox.effect_states IS 'Every effect in either storage with its state (docs/batch-storage.md).';

ALTER TABLE pgoutbox.effects ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgoutbox.effects_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE pgoutbox.enqueue_grants (
    grantee name NOT NULL,
    queue text NOT NULL,
    effect_type text,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT enqueue_grants_effect_type_check CHECK (((octet_length(effect_type) >= 1) AND (octet_length(effect_type) <= 128))),
    CONSTRAINT enqueue_grants_queue_check CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 128)))
);

CREATE TABLE pgoutbox.key_rune_classes (
    lo integer NOT NULL,
    hi integer NOT NULL,
    class "char" NOT NULL,
    CONSTRAINT key_rune_classes_check CHECK ((hi >= lo)),
    CONSTRAINT key_rune_classes_class_check CHECK ((class = ANY (ARRAY['U'::"char", 'L'::"char", 'O'::"char"])))
);

CREATE TABLE pgoutbox.lock_claims (
    id bigint NOT NULL,
    queue text NOT NULL,
    effect_ids bigint[] NOT NULL,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE pgoutbox.lock_claims IS 'The effects each open row-lock batch holds; a record left by a batch that never closed marks its effects as attempted (docs/design.md "Row-lock leases").';

ALTER TABLE pgoutbox.lock_claims ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME pgoutbox.lock_claims_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE UNLOGGED TABLE pgoutbox.notify_pending (
    pid integer NOT NULL,
    queue text NOT NULL
)
WITH (fillfactor='50');

CREATE UNLOGGED TABLE pgoutbox.notify_state (
    queue text NOT NULL,
    notified_at timestamp with time zone NOT NULL
);

CREATE TABLE pgoutbox.ordering_choices (
    queue text NOT NULL,
    effect_type text NOT NULL,
    dead_letter_moves_on boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ordering_choices_effect_type_check CHECK (((effect_type <> ''::text) AND (octet_length(effect_type) <= 128))),
    CONSTRAINT ordering_choices_queue_check CHECK (((queue <> ''::text) AND (octet_length(queue) <= 128)))
);

COMMENT ON TABLE pgoutbox.ordering_choices IS 'Per queue and effect type: does a dead letter let its ordering key move on (true) or block it until replayed (false)? Written by pgoutbox Clients, the NATS relay and consumer at start from EffectType.OrderingMovesOn; absent: pgoutbox.ordering_types, then strict.';

CREATE TABLE pgoutbox.ordering_stripes (
    stripe integer NOT NULL,
    CONSTRAINT ordering_stripes_stripe_check CHECK (((stripe >= 0) AND (stripe <= 1023)))
)
WITH (fillfactor='10');

COMMENT ON TABLE pgoutbox.ordering_stripes IS 'The ordering locks: an enqueue locks the rows of its (queue, ordering key) stripes until it commits (docs/design.md "Per-key ordering").';

CREATE TABLE pgoutbox.ordering_types (
    effect_type text NOT NULL,
    dead_letter_moves_on boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ordering_types_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128)))
);

COMMENT ON TABLE pgoutbox.ordering_types IS 'Before migration 00018: the ordering choice per effect type for every queue. Read only as the fallback of pgoutbox.ordering_choices; written only by Clients of earlier versions.';

CREATE TABLE pgoutbox.queue_pauses (
    queue text NOT NULL,
    paused_by text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    reason text DEFAULT ''::text NOT NULL,
    CONSTRAINT queue_pauses_paused_by_check CHECK ((length(paused_by) <= 200)),
    CONSTRAINT queue_pauses_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128))),
    CONSTRAINT queue_pauses_reason_check CHECK ((length(reason) <= 500))
);

COMMENT ON TABLE pgoutbox.queue_pauses IS 'Paused queues: no claim takes their effects while a row exists (docs/console.md).';

CREATE TABLE pgoutbox.queue_storage (
    queue text NOT NULL,
    storage text NOT NULL,
    chosen_at timestamp with time zone DEFAULT now() NOT NULL,
    lanes smallint DEFAULT 1 NOT NULL,
    left_batch_at timestamp with time zone,
    CONSTRAINT queue_storage_lanes CHECK (((lanes >= 1) AND (lanes <= 64))),
    CONSTRAINT queue_storage_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128))),
    CONSTRAINT queue_storage_storage_check CHECK ((storage = ANY (ARRAY['rows'::text, 'batch'::text])))
);

COMMENT ON TABLE pgoutbox.queue_storage IS 'Storage of each queue (rows: one row per effect; batch: pgoutbox.stream), written by the Clients that claim it.';

COMMENT ON COLUMN pgoutbox.queue_storage.lanes IS 'Lanes of a batch queue (QueueConfig.Lanes): consumers that may deliver it at once, each a range of slots.';

COMMENT ON COLUMN pgoutbox.queue_storage.left_batch_at IS 'When the storage went from batch to rows: the claim holds the ordered effects of the queue behind its stream''s unsettled ones (pgoutbox.stream_floor) until this is cleared.';

CREATE TABLE pgoutbox.replay_barriers (
    effect_id bigint NOT NULL,
    queue text NOT NULL,
    batch_id bigint NOT NULL,
    lease_token uuid NOT NULL,
    done_through bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE pgoutbox.replay_barriers IS 'Replayed move-on dead letters that wait for the batch page in flight at their replay (migration 00029, docs/batch-storage.md).';

CREATE TABLE pgoutbox.samples (
    sampled_at timestamp with time zone DEFAULT now() NOT NULL,
    queue text NOT NULL,
    claim_latency_p99_ms double precision,
    oldest_available_age_s double precision,
    completed_per_second double precision,
    workers_healthy boolean DEFAULT true NOT NULL,
    worker text DEFAULT ''::text NOT NULL,
    interval_s double precision DEFAULT 10 NOT NULL,
    claims bigint DEFAULT 0 NOT NULL,
    completions bigint DEFAULT 0 NOT NULL,
    failures bigint DEFAULT 0 NOT NULL,
    CONSTRAINT samples_claims_check CHECK ((claims >= 0)),
    CONSTRAINT samples_completions_check CHECK ((completions >= 0)),
    CONSTRAINT samples_failures_check CHECK ((failures >= 0)),
    CONSTRAINT samples_interval_s_check CHECK ((interval_s > (0)::double precision)),
    CONSTRAINT samples_worker_check CHECK ((length(worker) <= 256))
);

COMMENT ON TABLE pgoutbox.samples IS 'Aggregate worker samples (no payloads, no identifiers) read by `pgoutbox readiness broker`; pruned after 24 h by the sampler.';

CREATE TABLE pgoutbox.stream_0 (
    gen smallint NOT NULL,
    id bigint NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    queue text NOT NULL,
    effect_type text NOT NULL,
    idempotency_key text NOT NULL,
    payload json DEFAULT '{}'::json NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    traceparent text,
    slot smallint GENERATED ALWAYS AS (pgoutbox.stream_slot(ordering_key, id)) STORED NOT NULL,
    CONSTRAINT stream_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128))),
    CONSTRAINT stream_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (length(idempotency_key) <= 512))),
    CONSTRAINT stream_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT stream_ordering_key_check CHECK (((ordering_key <> ''::text) AND (octet_length(ordering_key) <= 512))),
    CONSTRAINT stream_payload_size CHECK ((octet_length(((payload)::jsonb)::text) <= 65536)),
    CONSTRAINT stream_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
);

CREATE TABLE pgoutbox.stream_1 (
    gen smallint NOT NULL,
    id bigint NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    queue text NOT NULL,
    effect_type text NOT NULL,
    idempotency_key text NOT NULL,
    payload json DEFAULT '{}'::json NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    traceparent text,
    slot smallint GENERATED ALWAYS AS (pgoutbox.stream_slot(ordering_key, id)) STORED NOT NULL,
    CONSTRAINT stream_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128))),
    CONSTRAINT stream_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (length(idempotency_key) <= 512))),
    CONSTRAINT stream_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT stream_ordering_key_check CHECK (((ordering_key <> ''::text) AND (octet_length(ordering_key) <= 512))),
    CONSTRAINT stream_payload_size CHECK ((octet_length(((payload)::jsonb)::text) <= 65536)),
    CONSTRAINT stream_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
);

CREATE TABLE pgoutbox.stream_2 (
    gen smallint NOT NULL,
    id bigint NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    queue text NOT NULL,
    effect_type text NOT NULL,
    idempotency_key text NOT NULL,
    payload json DEFAULT '{}'::json NOT NULL,
    max_attempts integer DEFAULT 8 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    traceparent text,
    slot smallint GENERATED ALWAYS AS (pgoutbox.stream_slot(ordering_key, id)) STORED NOT NULL,
    CONSTRAINT stream_effect_type_check CHECK (((effect_type <> ''::text) AND (length(effect_type) <= 128))),
    CONSTRAINT stream_idempotency_key_check CHECK (((idempotency_key <> ''::text) AND (length(idempotency_key) <= 512))),
    CONSTRAINT stream_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT stream_ordering_key_check CHECK (((ordering_key <> ''::text) AND (octet_length(ordering_key) <= 512))),
    CONSTRAINT stream_payload_size CHECK ((octet_length(((payload)::jsonb)::text) <= 65536)),
    CONSTRAINT stream_queue_check CHECK (((queue <> ''::text) AND (length(queue) <= 128)))
);

CREATE TABLE pgoutbox.stream_generations (
    gen smallint NOT NULL,
    state text NOT NULL,
    opened_at timestamp with time zone,
    closed_at timestamp with time zone,
    closed_xid xid8,
    CONSTRAINT stream_generations_check CHECK (((state = 'closed'::text) = (closed_xid IS NOT NULL))),
    CONSTRAINT stream_generations_gen_check CHECK (((gen >= 0) AND (gen <= 2))),
    CONSTRAINT stream_generations_state_check CHECK ((state = ANY (ARRAY['current'::text, 'closed'::text, 'empty'::text])))
);

CREATE VIEW pgoutbox.stream_pending AS
 SELECT s.id,
    q.queue,
    s.effect_type,
    s.available_at,
    s.created_at,
    (
        CASE
            WHEN ((o.lease_token IS NOT NULL) AND (o.lease_expires_at > now())) THEN 'leased'::text
            ELSE 'available'::text
        END)::pgoutbox.effect_state AS state
   FROM ((((pgoutbox.queue_storage q
     LEFT JOIN LATERAL ( SELECT n.snap
           FROM pgoutbox.stream_batches n
          WHERE (n.queue = q.queue)
          ORDER BY n.id DESC
         LIMIT 1) newest ON (true))
     LEFT JOIN LATERAL ( SELECT d.prev_snap,
            true AS open
           FROM pgoutbox.stream_batches d
          WHERE ((d.queue = q.queue) AND (d.done_at IS NULL))
          ORDER BY d.id
         LIMIT 1) oldest ON (true))
     CROSS JOIN LATERAL pgoutbox.stream_after(q.queue,
        CASE
            WHEN oldest.open THEN oldest.prev_snap
            ELSE newest.snap
        END) s(gen, id, xid, queue, effect_type, idempotency_key, payload, max_attempts, available_at, created_at, ordering_key, traceparent, slot))
     LEFT JOIN pgoutbox.stream_batches o ON (((o.queue = q.queue) AND (o.done_at IS NULL) AND ((s.id >= o.min_id) AND (s.id <= o.max_id)) AND ((s.slot >= o.slot_lo) AND (s.slot <= o.slot_hi)) AND pg_visible_in_snapshot(s.xid, o.snap) AND ((o.prev_snap IS NULL) OR (NOT pg_visible_in_snapshot(s.xid, o.prev_snap))))))
  WHERE
        CASE
            WHEN (o.queue IS NULL) THEN (NOT COALESCE(pg_visible_in_snapshot(s.xid, newest.snap), false))
            ELSE (NOT COALESCE((o.done_through >= s.id), false))
        END;

COMMENT ON VIEW pgoutbox.stream_pending IS 'Stream effects still to deliver, available or leased (docs/batch-storage.md).';

CREATE TABLE pgoutbox.stream_settled (
    queue text NOT NULL,
    effect_type text NOT NULL,
    settled_at timestamp with time zone DEFAULT now() NOT NULL,
    completed bigint NOT NULL,
    lag_p50 double precision NOT NULL,
    lag_p99 double precision NOT NULL,
    CONSTRAINT stream_settled_completed_check CHECK ((completed > 0))
);

COMMENT ON TABLE pgoutbox.stream_settled IS 'Completions of batch-storage effects per settled page and type, for status (docs/batch-storage.md).';

CREATE TABLE pgoutbox.work_grants (
    grantee name NOT NULL,
    queue text NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT work_grants_queue_check CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 128)))
);

CREATE TABLE pgoutbox.workers (
    id text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    version text DEFAULT ''::text NOT NULL,
    queues text[] NOT NULL,
    concurrency integer[] NOT NULL,
    in_flight integer DEFAULT 0 NOT NULL,
    heartbeat_interval_s double precision NOT NULL,
    started_at timestamp with time zone NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT workers_check CHECK ((cardinality(queues) = cardinality(concurrency))),
    CONSTRAINT workers_heartbeat_interval_s_check CHECK ((heartbeat_interval_s > (0)::double precision)),
    CONSTRAINT workers_host_check CHECK ((length(host) <= 256)),
    CONSTRAINT workers_id_check CHECK (((length(id) >= 1) AND (length(id) <= 256))),
    CONSTRAINT workers_in_flight_check CHECK ((in_flight >= 0)),
    CONSTRAINT workers_version_check CHECK ((length(version) <= 128))
);

COMMENT ON TABLE pgoutbox.workers IS 'One row per running worker process (Client with queues), upserted every heartbeat; stale after 3 missed heartbeats, then pruned.';

ALTER TABLE ONLY pgoutbox.stream ATTACH PARTITION pgoutbox.stream_0 FOR VALUES IN ('0');

ALTER TABLE ONLY pgoutbox.stream ATTACH PARTITION pgoutbox.stream_1 FOR VALUES IN ('1');

ALTER TABLE ONLY pgoutbox.stream ATTACH PARTITION pgoutbox.stream_2 FOR VALUES IN ('2');

ALTER TABLE ONLY pgoutbox.console_audit
    ADD CONSTRAINT console_audit_pkey PRIMARY KEY (id);

ALTER TABLE ONLY pgoutbox.effect_attempts
    ADD CONSTRAINT effect_attempts_pkey PRIMARY KEY (effect_id, seq);

ALTER TABLE ONLY pgoutbox.effect_keys
    ADD CONSTRAINT effect_keys_pkey PRIMARY KEY (queue, idempotency_key);

ALTER TABLE ONLY pgoutbox.effects
    ADD CONSTRAINT effects_pkey PRIMARY KEY (id);

ALTER TABLE pgoutbox.effects
    ADD CONSTRAINT effects_traceparent_format CHECK (((traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text) AND (substr(traceparent, 4, 32) <> repeat('0'::text, 32)) AND (substr(traceparent, 37, 16) <> repeat('0'::text, 16)))) NOT VALID;

ALTER TABLE ONLY pgoutbox.key_rune_classes
    ADD CONSTRAINT key_rune_classes_pkey PRIMARY KEY (lo);

ALTER TABLE ONLY pgoutbox.lock_claims
    ADD CONSTRAINT lock_claims_pkey PRIMARY KEY (id);

ALTER TABLE ONLY pgoutbox.notify_pending
    ADD CONSTRAINT notify_pending_pkey PRIMARY KEY (pid);

ALTER TABLE ONLY pgoutbox.notify_state
    ADD CONSTRAINT notify_state_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY pgoutbox.ordering_choices
    ADD CONSTRAINT ordering_choices_pkey PRIMARY KEY (queue, effect_type);

ALTER TABLE ONLY pgoutbox.ordering_stripes
    ADD CONSTRAINT ordering_stripes_pkey PRIMARY KEY (stripe);

ALTER TABLE ONLY pgoutbox.ordering_types
    ADD CONSTRAINT ordering_types_pkey PRIMARY KEY (effect_type);

ALTER TABLE ONLY pgoutbox.queue_pauses
    ADD CONSTRAINT queue_pauses_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY pgoutbox.queue_storage
    ADD CONSTRAINT queue_storage_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY pgoutbox.replay_barriers
    ADD CONSTRAINT replay_barriers_pkey PRIMARY KEY (effect_id);

ALTER TABLE ONLY pgoutbox.samples
    ADD CONSTRAINT samples_pkey PRIMARY KEY (sampled_at, queue, worker);

ALTER TABLE ONLY pgoutbox.stream_batches
    ADD CONSTRAINT stream_batches_pkey PRIMARY KEY (queue, id);

ALTER TABLE ONLY pgoutbox.stream_generations
    ADD CONSTRAINT stream_generations_pkey PRIMARY KEY (gen);

ALTER TABLE ONLY pgoutbox.work_grants
    ADD CONSTRAINT work_grants_pkey PRIMARY KEY (grantee, queue);

ALTER TABLE ONLY pgoutbox.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

CREATE INDEX effect_keys_created_idx ON pgoutbox.effect_keys USING btree (created_at);

CREATE INDEX effects_attention_idx ON pgoutbox.effects USING btree (queue, state, id) WHERE (state = ANY (ARRAY['dead_letter'::pgoutbox.effect_state, 'reconciliation_required'::pgoutbox.effect_state]));

CREATE INDEX effects_claim_idx ON pgoutbox.effects USING btree (queue, available_at, id) WHERE (state = 'available'::pgoutbox.effect_state);

CREATE INDEX effects_completed_idx ON pgoutbox.effects USING btree (completed_at) WHERE (state = 'completed'::pgoutbox.effect_state);

CREATE INDEX effects_lease_expiry_idx ON pgoutbox.effects USING btree (lease_expires_at) WHERE (state = 'leased'::pgoutbox.effect_state);

CREATE INDEX effects_ordered_leases_idx ON pgoutbox.effects USING btree (queue, ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state = 'leased'::pgoutbox.effect_state));

CREATE INDEX effects_ordering_idx ON pgoutbox.effects USING btree (queue, ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state <> 'completed'::pgoutbox.effect_state));

CREATE INDEX effects_parked_idx ON pgoutbox.effects USING btree (queue, ordering_key, id) WHERE (parked_due_at IS NOT NULL);

CREATE UNIQUE INDEX enqueue_grants_key ON pgoutbox.enqueue_grants USING btree (grantee, queue, COALESCE(effect_type, ''::text));

CREATE INDEX stream_id_idx ON ONLY pgoutbox.stream USING btree (id, slot);

CREATE INDEX stream_0_id_idx ON pgoutbox.stream_0 USING btree (id, slot);

CREATE INDEX stream_xid_idx ON ONLY pgoutbox.stream USING btree (queue, xid);

CREATE INDEX stream_0_queue_xid_idx ON pgoutbox.stream_0 USING btree (queue, xid);

CREATE INDEX stream_1_id_idx ON pgoutbox.stream_1 USING btree (id, slot);

CREATE INDEX stream_1_queue_xid_idx ON pgoutbox.stream_1 USING btree (queue, xid);

CREATE INDEX stream_2_id_idx ON pgoutbox.stream_2 USING btree (id, slot);

CREATE INDEX stream_2_queue_xid_idx ON pgoutbox.stream_2 USING btree (queue, xid);

CREATE INDEX stream_batches_open_idx ON pgoutbox.stream_batches USING btree (queue, id) WHERE (done_at IS NULL);

CREATE UNIQUE INDEX stream_generations_one_current ON pgoutbox.stream_generations USING btree (state) WHERE (state = 'current'::text);

CREATE INDEX stream_settled_at_idx ON pgoutbox.stream_settled USING btree (settled_at);

ALTER INDEX pgoutbox.stream_id_idx ATTACH PARTITION pgoutbox.stream_0_id_idx;

ALTER INDEX pgoutbox.stream_xid_idx ATTACH PARTITION pgoutbox.stream_0_queue_xid_idx;

ALTER INDEX pgoutbox.stream_id_idx ATTACH PARTITION pgoutbox.stream_1_id_idx;

ALTER INDEX pgoutbox.stream_xid_idx ATTACH PARTITION pgoutbox.stream_1_queue_xid_idx;

ALTER INDEX pgoutbox.stream_id_idx ATTACH PARTITION pgoutbox.stream_2_id_idx;

ALTER INDEX pgoutbox.stream_xid_idx ATTACH PARTITION pgoutbox.stream_2_queue_xid_idx;

CREATE TRIGGER effects_attempts_delete AFTER DELETE ON pgoutbox.effects REFERENCING OLD TABLE AS old_effects FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_attempts_delete();

CREATE TRIGGER effects_attempts_record AFTER UPDATE ON pgoutbox.effects FOR EACH ROW WHEN (((new.state IS DISTINCT FROM old.state) AND (new.state = ANY (ARRAY['available'::pgoutbox.effect_state, 'dead_letter'::pgoutbox.effect_state, 'reconciliation_required'::pgoutbox.effect_state])))) EXECUTE FUNCTION pgoutbox.effect_attempts_record();

CREATE TRIGGER effects_attempts_truncate AFTER TRUNCATE ON pgoutbox.effects FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_attempts_truncate();

CREATE TRIGGER effects_key_immutable BEFORE UPDATE OF queue, idempotency_key ON pgoutbox.effects FOR EACH ROW EXECUTE FUNCTION pgoutbox.effect_keys_immutable();

CREATE TRIGGER effects_keys_insert AFTER INSERT ON pgoutbox.effects REFERENCING NEW TABLE AS new_effects FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_keys_insert();

CREATE TRIGGER effects_keys_truncate AFTER TRUNCATE ON pgoutbox.effects FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.effect_keys_truncate();

CREATE TRIGGER effects_notify_insert AFTER INSERT ON pgoutbox.effects REFERENCING NEW TABLE AS new_effects FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.notify_effects();

CREATE TRIGGER effects_ordered_notify AFTER UPDATE OF state ON pgoutbox.effects FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) AND (new.state = ANY (ARRAY['completed'::pgoutbox.effect_state, 'dead_letter'::pgoutbox.effect_state])) AND (old.state IS DISTINCT FROM new.state))) EXECUTE FUNCTION pgoutbox.notify_ordered();

CREATE TRIGGER effects_ordering_key_immutable BEFORE UPDATE OF ordering_key ON pgoutbox.effects FOR EACH ROW EXECUTE FUNCTION pgoutbox.ordering_key_immutable();

CREATE TRIGGER effects_to_stream BEFORE INSERT ON pgoutbox.effects FOR EACH ROW WHEN ((current_setting('pgoutbox.routed'::text, true) IS DISTINCT FROM 'on'::text)) EXECUTE FUNCTION pgoutbox.effects_to_stream();

CREATE TRIGGER effects_unpark_next AFTER UPDATE OF state ON pgoutbox.effects FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) AND (new.state = ANY (ARRAY['completed'::pgoutbox.effect_state, 'dead_letter'::pgoutbox.effect_state])) AND (old.state IS DISTINCT FROM new.state))) EXECUTE FUNCTION pgoutbox.unpark_next();

CREATE CONSTRAINT TRIGGER notify_pending_at_commit AFTER INSERT OR UPDATE ON pgoutbox.notify_pending DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pgoutbox.notify_at_commit();

CREATE TRIGGER queue_storage_left_batch BEFORE UPDATE OF storage ON pgoutbox.queue_storage FOR EACH ROW WHEN ((old.storage IS DISTINCT FROM new.storage)) EXECUTE FUNCTION pgoutbox.queue_storage_left_batch();

CREATE TRIGGER stream_batches_floor_notify AFTER UPDATE ON pgoutbox.stream_batches FOR EACH ROW WHEN (((old.done_through IS DISTINCT FROM new.done_through) OR ((old.done_at IS NULL) AND (new.done_at IS NOT NULL)))) EXECUTE FUNCTION pgoutbox.stream_floor_notify();

CREATE TRIGGER stream_batches_replay_barriers AFTER UPDATE ON pgoutbox.stream_batches FOR EACH ROW WHEN (((old.done_through IS DISTINCT FROM new.done_through) OR (old.lease_token IS DISTINCT FROM new.lease_token) OR (new.done_at IS NOT NULL))) EXECUTE FUNCTION pgoutbox.replay_barriers_release();

CREATE TRIGGER stream_notify_insert AFTER INSERT ON pgoutbox.stream REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION pgoutbox.notify_stream();

GRANT USAGE ON SCHEMA pgoutbox TO pgoutbox_enqueuer;
GRANT USAGE ON SCHEMA pgoutbox TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer, lease interval, from_stream boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer, lease interval, from_stream boolean) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.claim_batch(queue text, worker text, effect_types text[], max_effects integer, lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.claim_batch(queue text, worker text, effect_types text[], max_effects integer, lease interval) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.clear_left_batch() FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.complete(id bigint, lease_token uuid, effect_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.complete(id bigint, lease_token uuid, effect_type text) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.dead_letter_moves_on(p_queue text, p_type text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.enqueue(queue text, effect_type text, idempotency_key text, payload json, max_attempts integer, available_at timestamp with time zone, delay interval, ordering_key text, traceparent text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.enqueue(queue text, effect_type text, idempotency_key text, payload json, max_attempts integer, available_at timestamp with time zone, delay interval, ordering_key text, traceparent text) TO pgoutbox_enqueuer;

REVOKE ALL ON FUNCTION pgoutbox.enqueue_batch(effects json) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.enqueue_batch(effects json) TO pgoutbox_enqueuer;

REVOKE ALL ON FUNCTION pgoutbox.enqueue_rows(p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[], p_available_at timestamp with time zone[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.enqueue_rows_routed(p_queues text[], p_types text[], p_keys text[], p_payloads json[], p_max_attempts integer[], p_available_at timestamp with time zone[], p_delays interval[], p_ordering_keys text[], p_traceparents text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.extend(ids bigint[], lease_tokens uuid[], effect_types text[], lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.extend(ids bigint[], lease_tokens uuid[], effect_types text[], lease interval) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.extend_batch(queue text, batch_id bigint, batch_token uuid, lease interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.extend_batch(queue text, batch_id bigint, batch_token uuid, lease interval) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.fail(id bigint, lease_token uuid, effect_type text, outcome text, error text, replay_safe boolean, retry_after interval, backoff_cap interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.fail(id bigint, lease_token uuid, effect_type text, outcome text, error text, replay_safe boolean, retry_after interval, backoff_cap interval) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.grant_enqueue(role_name text, queue text, effect_type text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.grant_work(role_name text, queue text) FROM PUBLIC;

GRANT ALL ON FUNCTION pgoutbox.key(VARIADIC parts text[]) TO pgoutbox_enqueuer;

REVOKE ALL ON FUNCTION pgoutbox.mark_started(id bigint, lease_token uuid, effect_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.mark_started(id bigint, lease_token uuid, effect_type text) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.may_enqueue(p_role name, p_queue text, p_type text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.may_work(p_role name, p_queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.recover_expired(queue text, max_effects integer) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.recover_expired(queue text, max_effects integer) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.replay_barriers_release() FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.retry_backoff(attempt integer, cap_seconds double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.revoke_enqueue(role_name text, queue text, effect_type text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.revoke_work(role_name text, queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[], outcomes text[], errors text[], retry_after interval[], backoff_cap interval) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[], outcomes text[], errors text[], retry_after interval[], backoff_cap interval) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.settle_page(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[], outcomes text[], errors text[], retry_after interval[], running bigint[], lease interval, backoff_cap interval, OUT settled boolean, OUT lease_ids bigint[], OUT lease_tokens uuid[]) FROM PUBLIC;
GRANT ALL ON FUNCTION pgoutbox.settle_page(queue text, batch_id bigint, batch_token uuid, through bigint, worker text, delivered bigint[], failed bigint[], outcomes text[], errors text[], retry_after interval[], running bigint[], lease interval, backoff_cap interval, OUT settled boolean, OUT lease_ids bigint[], OUT lease_tokens uuid[]) TO pgoutbox_worker;

REVOKE ALL ON FUNCTION pgoutbox.stream_after(p_queue text, p_snap pg_snapshot) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_floor(p_queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_floor_notify() FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_maintain(p_rotate_after interval, p_retention interval) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_next_batch(p_queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot, p_prev pg_snapshot, p_limit integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_page(p_queue text, p_after bigint, p_max_id bigint, p_snap pg_snapshot, p_prev pg_snapshot, p_limit integer, p_slot_lo smallint, p_slot_hi smallint) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_page_firsts(p_page pgoutbox.stream[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_page_of(b pgoutbox.stream_batches, p_through bigint, p_limit integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint, p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[], p_attempts integer[], p_delays double precision[], p_errors text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint, p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[], p_attempts integer[], p_delays double precision[], p_errors text[], p_tokens uuid[], p_lease_s double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_tick(p_queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.stream_to_rows(p_queue text, p_max integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_claim_batch(text, text, double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_claim_rows(text, integer, text, double precision, integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_complete_rows(bigint[], uuid[], text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_extend_batch(text, bigint, uuid, double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_extend_rows(bigint[], uuid[], text[], double precision) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_fail_row(bigint, uuid, text, text, double precision, text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_held_keys(text, text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_move_rows(bigint[], text[], integer[], double precision[], text[], text, text, uuid[], double precision[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_page_settled(text, text[], bigint[], double precision[], double precision[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_refuse_bound(p_bad boolean, p_column text, p_message text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_refuse_fences(p_role name, p_ids bigint[], p_tokens uuid[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_refuse_queue(p_role name, p_queue text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_release_batch(text, bigint, uuid) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_settle_batch_row(text, bigint, uuid, bigint, boolean, text[], bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_start_row(bigint, uuid, text) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgoutbox.work_sweep_rows(integer, double precision, text) FROM PUBLIC;