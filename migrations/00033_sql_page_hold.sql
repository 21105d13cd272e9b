-- +goose Up
-- A SQL batch worker's slow handler no longer holds its page and lane
-- (docs/any-language.md "Batch workers"; issue 32): pgoutbox.settle_page is
-- settle_batch (migration 00032) with the Go Client's PageHold. A worker
-- that stops waiting for a page's slowest handlers names them in running:
-- each moves to pgoutbox.effects as leased to the worker, with its first
-- attempt counted and a new lease token (settle_page returns them in
-- lease_ids and lease_tokens, in the order of running), and the worker
-- finishes it there with pgoutbox.complete or pgoutbox.fail and extends it
-- with pgoutbox.extend, as a row it claimed; the rest of the page settles
-- at once and the batch's lease goes back. A worker that dies first has
-- them recovered as every expired lease is (pgoutbox.recover_expired).
--
--   * settle_page(queue, batch_id, batch_token, through, worker, delivered,
--     failed, outcomes, errors, retry_after, running, lease, backoff_cap):
--     settle_batch's arguments, then running (ids of the page, each the
--     first of its key there, named in neither delivered nor failed) and
--     lease (the promoted leases', 1 second to 1 day, default 30 seconds).
--     It returns one row: settled (false: the batch's lease was lost,
--     nothing changed), lease_ids, lease_tokens.
--   * settle_batch is settle_page without running, and stream_settle_page
--     (its statement, which the claim also settles pages with) writes no
--     promoted lease: each is now a call of the function that does the
--     work, so the settle is written once.
--   * The promoted row is written by the Go settle's own statement
--     (pgoutbox.work_move_rows, store.moveSQL), with Go's Move for a
--     promoted run: leased, attempts 1, its own token and lease.
--
-- A queue switched from batch storage back to rows keeps the effects its
-- stream holds: claim_batch and stream_to_rows (pgoutbox.claim's) went on
-- delivering its open batches, but never ticked the effects committed
-- after the last tick, which no worker then delivered. They now serve a
-- queue whose storage is rows while the stream holds any effect of it
-- (delivered, to deliver or not yet ticked, until its generation is
-- rotated out), as the Go Client's batch loop does (store.StreamQueues):
-- each is created again from its definition with that one condition
-- changed.

-- stream_settle_page (migration 00032) with p_tokens, the lease token of
-- each of p_ids whose state is leased (NULL for the others, or empty: none
-- is leased), and p_lease_s, their lease in seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint,
    p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[],
    p_attempts integer[], p_delays float8[], p_errors text[], p_tokens uuid[], p_lease_s float8) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- The page settle without promoted leases (claim_batch's).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint,
    p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[],
    p_attempts integer[], p_delays float8[], p_errors text[]) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    RETURN pgoutbox.stream_settle_page(p_queue, p_batch, p_token, p_through, p_last, p_worker, p_page, p_done,
        p_ids, p_states, p_attempts, p_delays, p_errors, '{}'::uuid[], 0::float8);
END;
$$;
-- +goose StatementEnd

-- settle_page records the page of queue's batch batch_id that claim_batch
-- returned (through: its end), fenced by batch_token, and releases the
-- lease: delivered are the effects delivered; failed, with outcomes
-- (retry, retry_after, permanent, ambiguous, release) and errors (and
-- retry_after, empty or one interval per failed effect), those that were
-- not; running, those whose handlers still run, promoted to leases of
-- worker in pgoutbox.effects for lease (lease_ids, lease_tokens); every
-- other effect of the page moves unrun to the row storage. A failed effect
-- leaves for pgoutbox.effects: back to available after backoff_cap's
-- backoff (retry_after: no earlier than asked), to dead_letter when
-- permanent or out of attempts, unrun on release. settled false: the lease
-- was lost (another worker took the batch over), nothing changed.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.settle_page(queue text, batch_id bigint, batch_token uuid, through bigint, worker text,
                                     delivered bigint[], failed bigint[] DEFAULT '{}', outcomes text[] DEFAULT '{}',
                                     errors text[] DEFAULT '{}', retry_after interval[] DEFAULT '{}',
                                     running bigint[] DEFAULT '{}', lease interval DEFAULT interval '30 seconds',
                                     backoff_cap interval DEFAULT interval '300 seconds',
                                     OUT settled boolean, OUT lease_ids bigint[], OUT lease_tokens uuid[])
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
-- +goose StatementEnd

-- settle_batch (migration 00032) is settle_page without running.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint,
                                                 worker text, delivered bigint[], failed bigint[] DEFAULT '{}',
                                                 outcomes text[] DEFAULT '{}', errors text[] DEFAULT '{}',
                                                 retry_after interval[] DEFAULT '{}',
                                                 backoff_cap interval DEFAULT interval '300 seconds') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT s.settled FROM pgoutbox.settle_page(settle_batch.queue, settle_batch.batch_id,
        settle_batch.batch_token, settle_batch.through, settle_batch.worker, settle_batch.delivered,
        settle_batch.failed, settle_batch.outcomes, settle_batch.errors, settle_batch.retry_after, '{}',
        interval '30 seconds', settle_batch.backoff_cap) s);
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $do$
DECLARE
    f     record;
    v_def text;
    v_new text;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pgoutbox' AND p.proname IN ('claim_batch', 'stream_to_rows')
    LOOP
        v_def := pg_catalog.pg_get_functiondef(f.oid);
        v_new := pg_catalog.regexp_replace(v_def,
            'NOT EXISTS \(SELECT 1 FROM pgoutbox\.stream_batches x WHERE x\.queue = ([a-z_.]+) AND x\.done_at IS NULL\)',
            'NOT EXISTS (SELECT 1 FROM pgoutbox.stream x WHERE x.queue = \1)');
        IF v_new = v_def THEN
            RAISE EXCEPTION 'pgoutbox 00033: % has no open-batch condition to change', f.oid::regprocedure;
        END IF;
        EXECUTE v_new;
    END LOOP;
END;
$do$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.stream_settle_page(text, bigint, uuid, bigint, boolean, text, pgoutbox.stream[],
    bigint[], bigint[], text[], integer[], float8[], text[], uuid[], float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.settle_page(text, bigint, uuid, bigint, text, bigint[], bigint[], text[], text[],
    interval[], bigint[], interval, interval) FROM PUBLIC;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_worker') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.settle_page(text, bigint, uuid, bigint, text, bigint[], bigint[], text[],
            text[], interval[], bigint[], interval, interval) TO pgoutbox_worker;
    END IF;
END;
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $do$
DECLARE
    f     record;
    v_def text;
BEGIN
    FOR f IN
        SELECT p.oid FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'pgoutbox' AND p.proname IN ('claim_batch', 'stream_to_rows')
    LOOP
        v_def := pg_catalog.regexp_replace(pg_catalog.pg_get_functiondef(f.oid),
            'NOT EXISTS \(SELECT 1 FROM pgoutbox\.stream x WHERE x\.queue = ([a-z_.]+)\)',
            'NOT EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = \1 AND x.done_at IS NULL)');
        EXECUTE v_def;
    END LOOP;
END;
$do$;
-- +goose StatementEnd

-- The settle without promoted leases, as migration 00032 wrote it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint,
    p_last boolean, p_worker text, p_page pgoutbox.stream[], p_done bigint[], p_ids bigint[], p_states text[],
    p_attempts integer[], p_delays float8[], p_errors text[]) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
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
        array_agg(coalesce(f.error, '') ORDER BY p.id)
    INTO v_moves, v_states, v_tries, v_delays, v_errors
    FROM unnest(p_page) p
    LEFT JOIN unnest(p_ids, p_states, p_attempts, p_delays, p_errors) AS f(id, state, attempts, delay_s, error)
        ON f.id = p.id
    WHERE p.id <> ALL(p_done);
    IF v_moves IS NOT NULL THEN
        PERFORM pgoutbox.work_move_rows(v_moves, v_states, v_tries, v_delays, v_errors, p_worker, p_queue,
            array_fill(NULL::uuid, ARRAY[cardinality(v_moves)]), array_fill(0::float8, ARRAY[cardinality(v_moves)]));
    END IF;
    IF NOT p_last THEN
        PERFORM pgoutbox.work_release_batch(p_queue, p_batch, p_token);
    END IF;
    RETURN true;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint, worker text,
                                      delivered bigint[], failed bigint[] DEFAULT '{}', outcomes text[] DEFAULT '{}',
                                      errors text[] DEFAULT '{}', retry_after interval[] DEFAULT '{}',
                                      backoff_cap interval DEFAULT interval '300 seconds') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    b        pgoutbox.stream_batches;
    v_n      integer := coalesce(cardinality(settle_batch.failed), 0);
    v_page   pgoutbox.stream[];
    v_cap    float8;
    v_states text[];
    v_tries  integer[];
    v_delays float8[];
    v_firsts bigint[];
    v_bad    bigint;
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), settle_batch.queue);
    PERFORM pgoutbox.work_refuse_bound(octet_length(settle_batch.worker) NOT BETWEEN 1 AND 128, 'worker',
        'must be 1-128 bytes');
    PERFORM pgoutbox.work_refuse_bound(settle_batch.delivered IS NULL OR cardinality(settle_batch.delivered) > 1000
        OR array_position(settle_batch.delivered, NULL) IS NOT NULL, 'delivered',
        'must be an array of at most 1000 ids without NULL');
    PERFORM pgoutbox.work_refuse_bound(v_n > 1000 OR array_position(settle_batch.failed, NULL) IS NOT NULL
        OR coalesce(cardinality(settle_batch.outcomes), 0) <> v_n OR coalesce(cardinality(settle_batch.errors), 0) <> v_n
        OR coalesce(cardinality(settle_batch.retry_after), 0) NOT IN (0, v_n), 'failed',
        'outcomes, errors (and retry_after, unless empty) must be arrays of one length, at most 1000, ids without NULL');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (SELECT FROM unnest(settle_batch.outcomes) o
        WHERE o IS NULL OR o NOT IN ('retry', 'retry_after', 'permanent', 'ambiguous', 'release')),
        'outcomes', 'must each be retry, retry_after, permanent, ambiguous or release');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (SELECT FROM unnest(settle_batch.errors) e
        WHERE e IS NULL OR octet_length(e) > 65536), 'errors', 'must each be text of at most 65536 bytes');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (
        SELECT FROM unnest(settle_batch.outcomes, CASE WHEN cardinality(settle_batch.retry_after) = 0
            THEN array_fill(NULL::interval, ARRAY[v_n]) ELSE settle_batch.retry_after END) AS f(o, ra)
        WHERE (f.o = 'retry_after') <> (f.ra IS NOT NULL) OR f.ra NOT BETWEEN interval '0' AND interval '1 day'),
        'retry_after', 'is required with outcome retry_after only, between 0 and 1 day');
    PERFORM pgoutbox.work_refuse_bound(settle_batch.backoff_cap NOT BETWEEN interval '1 second' AND interval '1 day',
        'backoff_cap', 'must be between 1 second and 1 day');
    PERFORM pgoutbox.work_refuse_bound(EXISTS (
        SELECT x FROM unnest(settle_batch.delivered || settle_batch.failed) x GROUP BY x HAVING count(*) > 1),
        'failed', 'must not repeat an id, nor name one that delivered names');
    SELECT x.* INTO b FROM pgoutbox.stream_batches x
    WHERE x.queue = settle_batch.queue AND x.id = settle_batch.batch_id AND x.lease_token = settle_batch.batch_token
      AND x.done_at IS NULL
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgoutbox.work_refuse_bound(settle_batch.through NOT BETWEEN b.done_through + 1 AND b.max_id, 'through',
        'must be the end of the page claim_batch returned');
    v_page := pgoutbox.stream_page_of(b, settle_batch.through, 1001);
    PERFORM pgoutbox.work_refuse_bound(cardinality(v_page) > 1000, 'through',
        'spans more than 1000 effects: settle the page claim_batch returned');
    v_firsts := pgoutbox.stream_page_firsts(v_page);
    SELECT x INTO v_bad FROM unnest(settle_batch.delivered || settle_batch.failed) x
    WHERE x <> ALL(v_firsts)
    LIMIT 1;
    PERFORM pgoutbox.work_refuse_bound(v_bad IS NOT NULL, 'delivered',
        format('names effect %s, which is not one claim_batch returned for this page', v_bad));
    -- pgoutbox.fail's routing of a replay-safe effect's first attempt.
    v_cap := extract(epoch FROM settle_batch.backoff_cap);
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
    FROM unnest(settle_batch.failed, settle_batch.outcomes, CASE WHEN cardinality(settle_batch.retry_after) = 0
            THEN array_fill(NULL::interval, ARRAY[v_n]) ELSE settle_batch.retry_after END)
        WITH ORDINALITY AS f(id, o, ra, ord)
    JOIN unnest(v_page) p ON p.id = f.id;
    RETURN pgoutbox.stream_settle_page(settle_batch.queue, b.id, b.lease_token, settle_batch.through,
        settle_batch.through = b.max_id, settle_batch.worker, v_page, settle_batch.delivered,
        coalesce(settle_batch.failed, '{}'), coalesce(v_states, '{}'), coalesce(v_tries, '{}'),
        coalesce(v_delays, '{}'),
        ARRAY(SELECT CASE WHEN f.o = 'release' THEN '' ELSE f.e END
              FROM unnest(settle_batch.outcomes, settle_batch.errors) WITH ORDINALITY AS f(o, e, ord) ORDER BY f.ord));
END;
$$;
-- +goose StatementEnd

DROP FUNCTION pgoutbox.settle_page(text, bigint, uuid, bigint, text, bigint[], bigint[], text[], text[], interval[],
    bigint[], interval, interval);
DROP FUNCTION pgoutbox.stream_settle_page(text, bigint, uuid, bigint, boolean, text, pgoutbox.stream[], bigint[],
    bigint[], text[], integer[], float8[], text[], uuid[], float8);
