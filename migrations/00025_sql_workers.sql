-- +goose Up
-- Workers in any language (issue 31, point 2; docs/any-language.md,
-- "Workers"): SQL functions that claim, mark started, complete, fail and
-- extend effects under durable leases, with every rule of the Go engine, so
-- a TypeScript or Python service delivers what it enqueued.
--
--   * The statements are the Go engine's own (internal/store), verbatim:
--     pgoutbox.work_*_rows below hold claimSQL, startSQL, completeSQL,
--     failSQL, extendSQL and sweepSQL as they were when this migration was
--     written, and TestWorkerFunctionsRunTheEngineStatements fails when one
--     of those Go statements changes without a new migration replacing its
--     function. Fences, attempts, dead-lettering, delivery_started_at,
--     reconciliation and per-key ordering are those statements' rules.
--   * What the Go engine knows from a registered EffectType the caller
--     says: replay safety and the backoff cap at each failure (max attempts
--     were fixed at enqueue). pgoutbox.fail routes an outcome as Go's
--     failRoute does (lease.go): retry with 2^attempt s ±10 % backoff, cut
--     to the cap; retry_after no earlier than asked, up to 1 hour or the cap
--     when larger; permanent to dead_letter; ambiguous retried when
--     replay-safe, else reconciliation_required; release routed like every
--     recovery (pgoutbox.recovered_state).
--   * Durable leases only: a row-lock lease is a transaction held open for
--     the whole delivery, which a function call cannot hold for its caller.
--   * Grants. pgoutbox.work_grants holds (grantee, queue): the role grantee
--     and every role that has its privileges may work queue. Only the owner
--     writes it, with pgoutbox.grant_work(role, queue) and
--     pgoutbox.revoke_work(role, queue). Default: no rows. The role
--     pgoutbox_worker may execute the worker functions and nothing else:
--     it cannot enqueue. A caller that may UPDATE pgoutbox.effects (the
--     owner) needs no grant. The caller is the session's current role
--     (pgoutbox.enqueue_caller, 00015). Refusals are insufficient_privilege
--     (42501) and change nothing: claim checks the queue before anything,
--     the fenced functions refuse a role with no grant at all, and a fence
--     that matches a lease of a queue the role may not work (a role cannot
--     learn what it cannot hold: a fence without the lease's token matches
--     nothing).
--   * Bounds (OB001, nothing changed): queue 1-128 bytes, worker 1-128
--     bytes, 1-1000 effects per claim or extension, leases from 1 second
--     to 1 day, error text up to 65536 bytes (stored cut to 2000
--     characters, as Go's), retry_after from 0 to 1 day, backoff cap from
--     1 second to 1 day.
--   * A stale fence changes nothing and says so: mark_started and complete
--     return false, fail returns NULL, extend leaves the fence out of its
--     answer.

-- +goose StatementBegin
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_worker') THEN
        BEGIN
            CREATE ROLE pgoutbox_worker NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;
            WHEN insufficient_privilege THEN
                RAISE WARNING 'pgoutbox: cannot create the role pgoutbox_worker (no CREATEROLE); '
                    'create it and grant it as docs/any-language.md says';
        END;
    END IF;
END;
$$;
-- +goose StatementEnd

CREATE TABLE pgoutbox.work_grants (
    grantee     name NOT NULL,
    queue       text NOT NULL CHECK (octet_length(queue) BETWEEN 1 AND 128),
    granted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grantee, queue)
);
REVOKE ALL ON TABLE pgoutbox.work_grants FROM PUBLIC;

-- may_work reports whether p_role may work p_queue.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.may_work(p_role name, p_queue text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT has_table_privilege(p_role, 'pgoutbox.effects', 'UPDATE')
        OR EXISTS (
            SELECT FROM pgoutbox.work_grants g JOIN pg_roles r ON r.rolname = g.grantee
            WHERE g.queue = p_queue AND pg_has_role(p_role, r.oid, 'USAGE'))
$$;
-- +goose StatementEnd

-- work_refuse_queue raises 42501 unless p_role may work p_queue.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_refuse_queue(p_role name, p_queue text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT coalesce(pgoutbox.may_work(p_role, p_queue), false) THEN
        RAISE EXCEPTION 'pgoutbox: role "%" may not work queue "%" (the owner grants it with pgoutbox.grant_work)',
            p_role, p_queue
            USING ERRCODE = 'insufficient_privilege', COLUMN = 'queue';
    END IF;
END;
$$;
-- +goose StatementEnd

-- work_refuse_fences raises 42501 when p_role may work no queue at all, or
-- when a fence (id, lease token) matches a lease of a queue p_role may not
-- work; it reads one primary-key probe per fence.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_refuse_fences(p_role name, p_ids bigint[], p_tokens uuid[]) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- work_refuse_bound raises OB001 (invalid input, nothing changed) with
-- p_message when p_bad is true or NULL.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_refuse_bound(p_bad boolean, p_column text, p_message text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_bad IS NOT FALSE THEN
        RAISE EXCEPTION 'pgoutbox: invalid argument: % %', p_column, p_message
            USING ERRCODE = 'OB001', COLUMN = p_column;
    END IF;
END;
$$;
-- +goose StatementEnd

-- grant_work lets role_name (and the roles that have its privileges) work
-- queue through the worker functions. It returns false when the grant
-- existed. Only the owner may call it.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.grant_work(role_name text, queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
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
$$;
-- +goose StatementEnd

-- revoke_work removes role_name's grant on queue; it returns how many
-- grants it removed (0 or 1).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.revoke_work(role_name text, queue text) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    DELETE FROM pgoutbox.work_grants g WHERE g.grantee = revoke_work.role_name AND g.queue = revoke_work.queue;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END;
$$;
-- +goose StatementEnd

-- The engine's statements (internal/store), verbatim, with their Go
-- parameters ($1, $2, …). Only the owner and the functions below run them.

-- store.claimSQL: $1 queue, $2 limit, $3 owner, $4 lease seconds, $5 added
-- to attempts.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_claim_rows(text, integer, text, float8, integer)
RETURNS TABLE (r_id bigint, r_queue text, r_effect_type text, r_key text, r_payload jsonb, r_attempts integer,
               r_max_attempts integer, r_token uuid, r_created_at timestamptz, r_latency float8,
               r_delivery_started_at timestamptz, r_ordering_key text, r_traceparent text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH next AS (SELECT id 
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
      AND (e.ordering_key IS NULL OR (NOT EXISTS (
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
          AND p.ordering_key IS NOT NULL AND p.state = 'leased')))
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
SET state = 'leased', attempts = e.attempts + $5::int, lease_owner = $3,
    lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = statement_timestamp() + make_interval(secs => $4)
WHERE e.id = ANY(ARRAY(SELECT id FROM next))
RETURNING e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts,
    e.lease_token, e.created_at, extract(epoch FROM now() - e.available_at)::float8, e.delivery_started_at,
    coalesce(e.ordering_key, ''), coalesce(e.traceparent, '')
$fn$;
-- +goose StatementEnd

-- store.startSQL, returning the id it marked: $1 id, $2 token, $3 type.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_start_row(bigint, uuid, text) RETURNS SETOF bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
UPDATE pgoutbox.effects SET delivery_started_at = now()
WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3
  AND lease_expires_at > now()
RETURNING id
$fn$;
-- +goose StatementEnd

-- store.completeSQL: $1 ids, $2 tokens, $3 types.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_complete_rows(bigint[], uuid[], text[])
RETURNS TABLE (r_id bigint, r_token uuid, r_effect_type text, r_lag float8)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;
-- +goose StatementEnd

-- store.failSQL: $1 id, $2 token, $3 type, $4 route (store.FailKind), $5
-- delay seconds, $6 error.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_fail_row(bigint, uuid, text, text, float8, text) RETURNS SETOF text
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
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
SET state = t.next_state,
    available_at = CASE WHEN t.next_state = 'available' THEN now() + make_interval(secs => $5) ELSE e.available_at END,
    dead_lettered_at = CASE WHEN t.next_state = 'dead_letter' THEN now() END,
    reconciliation_at = CASE WHEN t.next_state = 'reconciliation_required' THEN now() END,
    delivery_started_at = CASE WHEN t.next_state = 'available' THEN NULL ELSE e.delivery_started_at END,
    lease_token = NULL, lease_expires_at = NULL, last_error = left($6, 2000)
FROM target t
WHERE e.id = t.id
RETURNING e.state::text
$fn$;
-- +goose StatementEnd

-- store.extendSQL: $1 ids, $2 tokens, $3 types, $4 lease seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_extend_rows(bigint[], uuid[], text[], float8)
RETURNS TABLE (r_id bigint, r_token uuid, r_effect_type text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;
-- +goose StatementEnd

-- store.sweepSQL: $1 limit, $2 grace seconds, $3 queue (NULL: every queue).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_sweep_rows(integer, float8, text)
RETURNS TABLE (r_id bigint, r_queue text, r_effect_type text, r_state text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH expired AS (
    SELECT id FROM pgoutbox.effects
    WHERE state = 'leased' AND lease_expires_at < now() - make_interval(secs => $2)
      AND ($3::text IS NULL OR queue = $3)
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE pgoutbox.effects e
SET state = pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts),
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
$fn$;
-- +goose StatementEnd

-- retry_backoff is Go's retryBackoff (config.go) in seconds: 2^attempt s,
-- cut to the cap, times a jitter of ±10 %, cut to the cap again.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.retry_backoff(attempt integer, cap_seconds float8) RETURNS float8
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT least(least(power(2::float8, attempt), cap_seconds) * (1 + (random() * 0.2 - 0.1)), cap_seconds)
$$;
-- +goose StatementEnd

-- claim leases up to max_effects available effects of queue for worker
-- (recorded as lease_owner), oldest (available_at, id) first, skipping rows
-- another claimer holds, under per-key ordering; each claim counts an
-- attempt. The lease expires lease after the call unless extended.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer DEFAULT 1,
                               lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (id bigint, effect_type text, idempotency_key text, payload jsonb, attempt integer,
               max_attempts integer, lease_token uuid, created_at timestamptz,
               delivery_started_at timestamptz, ordering_key text, traceparent text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), claim.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(claim.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(claim.max_effects NOT BETWEEN 1 AND 1000, 'max_effects',
        'must be between 1 and 1000');
    PERFORM pgoutbox.work_refuse_bound(claim.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    RETURN QUERY
    SELECT c.r_id, c.r_effect_type, c.r_key, c.r_payload, c.r_attempts, c.r_max_attempts, c.r_token,
        c.r_created_at, c.r_delivery_started_at, nullif(c.r_ordering_key, ''), nullif(c.r_traceparent, '')
    FROM pgoutbox.work_claim_rows(claim.queue, claim.max_effects, claim.worker,
        extract(epoch FROM claim.lease)::float8, 1) c;
END;
$$;
-- +goose StatementEnd

-- mark_started records, fenced, that delivery of a non-replay-safe effect
-- starts now: commit it before the request is sent. From then on an
-- unknown outcome (an ambiguous failure, an expired lease) routes the
-- effect to reconciliation_required. false: the lease was lost or has
-- expired; do not deliver.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.mark_started(id bigint, lease_token uuid, effect_type text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_fences(pgoutbox.enqueue_caller(), ARRAY[mark_started.id],
        ARRAY[mark_started.lease_token]);
    RETURN EXISTS (SELECT FROM pgoutbox.work_start_row(mark_started.id, mark_started.lease_token,
        mark_started.effect_type));
END;
$$;
-- +goose StatementEnd

-- complete marks a leased effect completed, fenced. false: the lease was
-- lost, nothing changed.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.complete(id bigint, lease_token uuid, effect_type text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- fail records a failed delivery, fenced, and returns the effect's new
-- state (available, dead_letter, reconciliation_required), or NULL when
-- the lease was lost (nothing changed). outcome: retry (nothing was
-- delivered), retry_after (with retry_after), permanent, ambiguous (the
-- request may have been processed), release (a worker stopping gives the
-- effect back). replay_safe and backoff_cap are the effect type's, as a Go
-- EffectType and Config.BackoffCap say them.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.fail(id bigint, lease_token uuid, effect_type text, outcome text, error text,
                              replay_safe boolean, retry_after interval DEFAULT NULL,
                              backoff_cap interval DEFAULT interval '300 seconds') RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- extend pushes the leases of in-flight effects to now() + lease and
-- returns the fences still held; a fence left out lost its lease. It never
-- waits for a row lock (store.extendSQL).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.extend(ids bigint[], lease_tokens uuid[], effect_types text[], lease interval)
RETURNS TABLE (id bigint, lease_token uuid)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- recover_expired recovers up to max_effects expired leases of queue, as
-- the Go sweeper does for every queue: a started non-replay-safe effect
-- goes to reconciliation_required, an exhausted one to dead_letter, any
-- other back to available. A service without a Go process calls it on a
-- timer (the TypeScript Worker does).
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.recover_expired(queue text, max_effects integer DEFAULT 100)
RETURNS TABLE (id bigint, effect_type text, state text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.may_work(name, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_refuse_queue(name, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_refuse_fences(name, bigint[], uuid[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_refuse_bound(boolean, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.grant_work(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.revoke_work(text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_claim_rows(text, integer, text, float8, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_start_row(bigint, uuid, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_complete_rows(bigint[], uuid[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_fail_row(bigint, uuid, text, text, float8, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_extend_rows(bigint[], uuid[], text[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_sweep_rows(integer, float8, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.retry_backoff(integer, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.mark_started(bigint, uuid, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.complete(bigint, uuid, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.fail(bigint, uuid, text, text, text, boolean, interval, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.extend(bigint[], uuid[], text[], interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.recover_expired(text, integer) FROM PUBLIC;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_worker') THEN
        GRANT USAGE ON SCHEMA pgoutbox TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.mark_started(bigint, uuid, text) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.complete(bigint, uuid, text) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.fail(bigint, uuid, text, text, text, boolean, interval, interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.extend(bigint[], uuid[], text[], interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.recover_expired(text, integer) TO pgoutbox_worker;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- The role stays: it belongs to the cluster and may serve other databases.
DROP FUNCTION pgoutbox.recover_expired(text, integer);
DROP FUNCTION pgoutbox.extend(bigint[], uuid[], text[], interval);
DROP FUNCTION pgoutbox.fail(bigint, uuid, text, text, text, boolean, interval, interval);
DROP FUNCTION pgoutbox.complete(bigint, uuid, text);
DROP FUNCTION pgoutbox.mark_started(bigint, uuid, text);
DROP FUNCTION pgoutbox.claim(text, text, integer, interval);
DROP FUNCTION pgoutbox.retry_backoff(integer, float8);
DROP FUNCTION pgoutbox.work_sweep_rows(integer, float8, text);
DROP FUNCTION pgoutbox.work_extend_rows(bigint[], uuid[], text[], float8);
DROP FUNCTION pgoutbox.work_fail_row(bigint, uuid, text, text, float8, text);
DROP FUNCTION pgoutbox.work_complete_rows(bigint[], uuid[], text[]);
DROP FUNCTION pgoutbox.work_start_row(bigint, uuid, text);
DROP FUNCTION pgoutbox.work_claim_rows(text, integer, text, float8, integer);
DROP FUNCTION pgoutbox.revoke_work(text, text);
DROP FUNCTION pgoutbox.grant_work(text, text);
DROP FUNCTION pgoutbox.work_refuse_bound(boolean, text, text);
DROP FUNCTION pgoutbox.work_refuse_fences(name, bigint[], uuid[]);
DROP FUNCTION pgoutbox.work_refuse_queue(name, text);
DROP FUNCTION pgoutbox.may_work(name, text);
DROP TABLE pgoutbox.work_grants;
