-- +goose Up
-- Enqueue grants and payload bounds (issue 27; docs/any-language.md, "The
-- role" and "Payload bounds").
--
-- Grants. pgoutbox_enqueuer (00008) could enqueue anything into any queue,
-- the applications' internal queues included. Since 00015 the SQL API's
-- functions enqueue only what the owner granted:
--
--   * pgoutbox.enqueue_grants holds (grantee, queue, effect_type): the role
--     grantee (and every role that has its privileges) may enqueue effects of
--     effect_type (NULL: every type) into queue. Only the owner writes it,
--     with pgoutbox.grant_enqueue(role, queue [, type]) and
--     pgoutbox.revoke_enqueue(role, queue [, type]). Default: no rows,
--     nothing may be enqueued through the SQL API.
--   * The caller is the session's current role: the role of SET ROLE, or
--     the session user without one (inside the SECURITY DEFINER functions
--     current_user is the owner; the "role" setting still names the caller's
--     role, and SET ROLE accepts only roles the session user may become). A
--     grant covers the caller when pg_has_role(caller, grantee, 'USAGE'):
--     the caller is the grantee or inherits its privileges.
--   * A caller that may INSERT into pgoutbox.effects (the owner, a
--     superuser) needs no grant: it can write the table directly.
--   * Refusals are insufficient_privilege (42501) and write nothing; a batch
--     with one refused element writes none. The check runs before anything
--     else, so an ungranted role costs the server no payload work.
--   * A key taken in the queue answers the existing effect's id only when
--     the caller may enqueue that effect's type (a queue-wide grant covers
--     every type; an effect whose row is gone, its key retained, only
--     that). Otherwise 42501, without the id. Keys are unique per queue and
--     the queue must be granted before any key is looked at, so a role
--     learns nothing about the keys of a queue it may not enqueue into.
--
-- Payload bounds. Before a payload is parsed into jsonb (the functions take
-- json, which PostgreSQL's input only validates: numbers stay text) it must
-- nest at most 64 levels of arrays and objects and carry no number literal
-- over 100 characters or with an exponent beyond ±400 (Go's MaxPayloadDepth,
-- MaxNumberLength, MaxNumberExponent); refusals are OB001 on payload. The
-- credential-key guard walks the payload once (its recursive query of 00008
-- re-read every nested value: quadratic in the depth). A batch's elements
-- are read in one pass (json_array_elements), not by index.

CREATE TABLE pgoutbox.enqueue_grants (
    grantee      name NOT NULL,
    queue        text NOT NULL CHECK (octet_length(queue) BETWEEN 1 AND 128),
    effect_type  text CHECK (octet_length(effect_type) BETWEEN 1 AND 128),
    granted_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX enqueue_grants_key ON pgoutbox.enqueue_grants (grantee, queue, coalesce(effect_type, ''));
REVOKE ALL ON TABLE pgoutbox.enqueue_grants FROM PUBLIC;

-- enqueue_caller is the role the SQL API checks grants for: the session's
-- current role (SET ROLE's, else the session user's), as the caller sees it
-- outside the SECURITY DEFINER function.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.enqueue_caller() RETURNS name
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END
$$;
-- +goose StatementEnd

-- may_enqueue reports whether p_role may enqueue an effect of p_type (NULL:
-- unknown, so only a queue-wide grant covers it) into p_queue.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.may_enqueue(p_role name, p_queue text, p_type text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT has_table_privilege(p_role, 'pgoutbox.effects', 'INSERT')
        OR EXISTS (
            SELECT FROM pgoutbox.enqueue_grants g JOIN pg_roles r ON r.rolname = g.grantee
            WHERE g.queue = p_queue AND (g.effect_type IS NULL OR g.effect_type = p_type)
              AND pg_has_role(p_role, r.oid, 'USAGE'))
$$;
-- +goose StatementEnd

-- grant_enqueue lets role_name (and the roles that have its privileges)
-- enqueue effects of effect_type (NULL: every type) into queue through the
-- SQL API. It returns false when the grant existed. Only the owner may call
-- it (it writes pgoutbox.enqueue_grants).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.grant_enqueue(role_name text, queue text, effect_type text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;
-- +goose StatementEnd

-- revoke_enqueue removes role_name's grant on queue for effect_type, or,
-- with effect_type NULL, every grant of role_name on queue; it returns how
-- many it removed. A role that has the grantee's privileges loses them with
-- it; a role granted on its own keeps its own grants.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.revoke_enqueue(role_name text, queue text, effect_type text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.grant_enqueue(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.revoke_enqueue(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.may_enqueue(name, text, text) FROM PUBLIC;

-- json_bounds returns why the JSON text s (valid JSON) is out of the
-- payload bounds, or NULL: nested deeper than 64 levels of arrays and
-- objects, a number literal over 100 characters, a number with an exponent
-- beyond ±400 (in that order of precedence, as Go's). Linear in s: strings
-- are blanked out first (they hold no structure), then the brackets'
-- running depth and the number literals are read.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.json_bounds(s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
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
-- +goose StatementEnd

-- credential_key_path returns the path ($.a[0].b) of the first object key,
-- in document order, that is_credential_key refuses, or NULL. Since 00015 it
-- reads the json text once: one regular expression lists every string in
-- document order (a string followed by ':' is a key), the keys that may hold
-- a credential are decoded and checked, and only for a refused key are the
-- tokens before it walked to name its path. Every occurrence of a repeated
-- key is seen (json, not jsonb).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.credential_key_path(payload json) RETURNS text
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET plan_cache_mode = force_generic_plan
AS $$
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
$$;
-- +goose StatementEnd

-- enqueue_rows (00013) checks the grants and the payload bounds, and answers
-- a taken key only with the grant (00015, above).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.enqueue_rows(
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

-- enqueue_batch (00013) reads its array in one pass and bounds its numbers
-- before reading them (00015).
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

-- +goose Down
-- The functions of 00013 and 00008, as they were.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.enqueue_rows(
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.credential_key_path(payload json) RETURNS text
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_path text;
BEGIN
    IF NOT pgoutbox.may_hold_credential_key(payload::text) THEN
        RETURN NULL;
    END IF;
    WITH RECURSIVE walk(pos, path, cred, value) AS (
        SELECT ARRAY[]::integer[], '$'::text, false, payload
        UNION ALL
        SELECT w.pos || e.ord::integer,
               CASE WHEN e.name IS NULL THEN w.path || '[' || (e.ord - 1) || ']' ELSE w.path || '.' || e.name END,
               e.cred, e.value
        FROM walk w
        CROSS JOIN LATERAL (
            SELECT o.key AS name, o.value, o.ord,
                   pgoutbox.has_credential_stem(o.key) AND pgoutbox.is_credential_key(o.key) AS cred
            FROM json_each(CASE WHEN json_typeof(w.value) = 'object' THEN w.value ELSE '{}' END)
                WITH ORDINALITY AS o(key, value, ord)
            UNION ALL
            SELECT NULL, a.value, a.ord, false
            FROM json_array_elements(CASE WHEN json_typeof(w.value) = 'array' THEN w.value ELSE '[]' END)
                WITH ORDINALITY AS a(value, ord)
        ) e
        WHERE NOT w.cred AND (e.cred OR (json_typeof(e.value) IN ('object', 'array')
                                         AND pgoutbox.may_hold_credential_key(e.value::text)))
    )
    SELECT walk.path INTO v_path FROM walk WHERE walk.cred ORDER BY walk.pos LIMIT 1;
    RETURN v_path;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION pgoutbox.json_bounds(text);
DROP FUNCTION pgoutbox.revoke_enqueue(text, text, text);
DROP FUNCTION pgoutbox.grant_enqueue(text, text, text);
DROP FUNCTION pgoutbox.may_enqueue(name, text, text);
DROP FUNCTION pgoutbox.enqueue_caller();
DROP TABLE pgoutbox.enqueue_grants;
