-- +goose Up
-- Workers in any language deliver a batch queue from its batch
-- (docs/batch-storage.md, docs/any-language.md "Batch workers"; issue 32):
-- pgoutbox.claim_batch, settle_batch and extend_batch write nothing per
-- effect delivered, as the Go Client's batch loop does. pgoutbox.claim
-- (migration 00028) delivers a batch queue too, but moves each effect into
-- pgoutbox.effects first: a row per effect, the row storage's cost and more.
--
--   * claim_batch leases the queue's next batch (the Go claim's statement,
--     store.claimBatchSQL: oldest first per lane, fenced by a new token,
--     not while the queue is paused; ticking once when there is none) and
--     reads its next page, at most max_effects effects. It returns the
--     effects the caller may deliver from the batch: of the types it names
--     (the caller says they are replay-safe: a crash before the settle
--     delivers them again), due, the first of their ordering key in the
--     page, and whose key no effect in pgoutbox.effects holds. Every other
--     effect of the page moves into pgoutbox.effects, unrun, when the page
--     is settled, behind what holds it, as in the Go Client.
--   * A page with nothing to deliver is settled by claim_batch itself, and
--     so is the page of a batch whose former holder let its lease expire
--     (its effects move to the row storage, the first of each key with the
--     attempt it may have had): then the next page is read, up to four
--     pages a call.
--   * settle_batch records the page, fenced by the batch's token, in one
--     transaction: the delivered effects are counted (stream_settled), the
--     failed ones move into pgoutbox.effects routed as pgoutbox.fail routes
--     a replay-safe effect's first attempt (retry after the backoff,
--     retry_after, permanent to dead_letter, release back unrun), every
--     other effect of the page moves unrun, the settled position advances
--     and the lease is released (the batch is done after its last page).
--     A stale token changes nothing and returns false.
--   * extend_batch pushes the lease further while the page's deliveries
--     run.
--   * The statements are the Go engine's own (internal/store), verbatim, in
--     pgoutbox.work_*batch* below (TestWorkerFunctionsRunTheEngineStatements).
--   * pgoutbox.claim gains from_stream (default true, as before): false
--     claims rows only, moving nothing out of the stream, for a worker
--     that delivers the batches with claim_batch and claims the row
--     storage (retries, other types) beside them. The function is dropped
--     and created again with the new argument (4-argument calls resolve
--     to it); its EXECUTE is granted to pgoutbox_worker again, and a grant
--     made to another role by hand must be made again.
--   * The functions of the batch path run their statements as PL/pgSQL,
--     which keeps a statement's plan for the session, where a LANGUAGE sql
--     function plans its body at every call (PostgreSQL 15): the new ones,
--     and may_work and stream_next_batch, which are created again from
--     their definitions with the same statement (RETURN QUERY or RETURN
--     around it). claim_batch of 10 and its settle, one connection: 2,437
--     effects/s before, 3,556 after (BenchmarkSQLWorkerDrain, 2 runs
--     each). Left as they were: stream_page (the Go Client's page read
--     through a PL/pgSQL stream_page drained 8 % slower: 101,000 against
--     109,800 effects/s), and 00025's pgoutbox.work_*_rows (as PL/pgSQL,
--     a claim of a batch queue through pgoutbox.claim ran 2.5 times
--     slower at 20,000 effects, for a reason not found).
--   * Grants and bounds as migration 00025's: the caller must be granted
--     the queue (pgoutbox.grant_work) before anything is read; every
--     argument is bounded (OB001, nothing changed); settle_batch accepts
--     only ids of the page it settles, each the first of its key there.

-- store.claimBatchSQL: $1 queue, $2 owner, $3 lease seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_claim_batch(text, text, float8)
RETURNS TABLE (r_id bigint, r_snap text, r_prev_snap text, r_min_id bigint, r_max_id bigint, r_effects bigint,
               r_done_through bigint, r_token uuid, r_relet boolean, r_slot_lo smallint, r_slot_hi smallint)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
RETURN QUERY
WITH head AS (
    SELECT b.id, b.lease_token IS NOT NULL AS relet FROM pgoutbox.stream_next_batch($1) b
    WHERE NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)
)
UPDATE pgoutbox.stream_batches b
SET lease_token = gen_random_uuid(), lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3)
FROM head
WHERE b.queue = $1 AND b.id = head.id AND b.done_at IS NULL
  AND (b.lease_token IS NULL OR b.lease_expires_at < now())
RETURNING b.id, b.snap::text, b.prev_snap::text, b.min_id, b.max_id, b.effects, b.done_through, b.lease_token,
    head.relet, b.slot_lo, b.slot_hi;
END;
$fn$;
-- +goose StatementEnd

-- store.heldKeysSQL: $1 queue, $2 ordering keys.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_held_keys(text, text[]) RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;
-- +goose StatementEnd

-- store.settleFenceSQL, returning the batch it settled: $1 queue, $2 batch
-- id, $3 token, $4 position, $5 done, $6 and $7 the page's effects per type.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_settle_batch_row(text, bigint, uuid, bigint, boolean, text[], bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches
SET done_through = $4, done_at = CASE WHEN $5 THEN now() END,
    lease_token = CASE WHEN $5 THEN NULL ELSE lease_token END,
    lease_expires_at = CASE WHEN $5 THEN NULL ELSE lease_expires_at END,
    type_passed = pgoutbox.stream_passed(type_names, type_passed, $6::text[], $7::bigint[])
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$fn$;
-- +goose StatementEnd

-- store.moveSQL: $1 ids, $2 states, $3 attempts, $4 delays (s), $5 errors,
-- $6 worker, $7 queue, $8 lease tokens, $9 lease seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_move_rows(bigint[], text[], integer[], float8[], text[], text, text, uuid[], float8[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
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
$fn$;
-- +goose StatementEnd

-- store.settledSQL: $1 queue, $2 types, $3 counts, $4 and $5 lag seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_page_settled(text, text[], bigint[], float8[], float8[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
INSERT INTO pgoutbox.stream_settled (queue, effect_type, completed, lag_p50, lag_p99)
SELECT $1, t.* FROM unnest($2::text[], $3::bigint[], $4::float8[], $5::float8[]) AS t;
END;
$fn$;
-- +goose StatementEnd

-- store.releaseBatchSQL, returning the batch: $1 queue, $2 id, $3 token.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_release_batch(text, bigint, uuid) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$fn$;
-- +goose StatementEnd

-- store.extendBatchSQL, returning the batch: $1 queue, $2 id, $3 token, $4
-- lease seconds.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.work_extend_batch(text, bigint, uuid, float8) RETURNS SETOF bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
RETURN QUERY
UPDATE pgoutbox.stream_batches SET lease_expires_at = now() + make_interval(secs => $4)
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL
RETURNING id;
END;
$fn$;
-- +goose StatementEnd

-- stream_settle_page settles a page of p_queue's batch p_batch, fenced by
-- p_token: p_page is every effect of the page (the batch's after its
-- settled position, through p_through; p_last: the batch's last page),
-- p_done those delivered from the batch, p_ids those that failed, with the
-- state, attempts, delay (s) and error each moves with. Every other effect
-- of the page moves unrun. false: the token no longer holds the lease,
-- nothing changed. The Go Client's store.Settle, for the SQL API.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_settle_page(p_queue text, p_batch bigint, p_token uuid, p_through bigint,
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

-- stream_page_of reads the page of batch b that ends at p_through (at most
-- p_limit effects), in id order.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_page_of(b pgoutbox.stream_batches, p_through bigint, p_limit integer)
    RETURNS pgoutbox.stream[]
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(p ORDER BY p.id), '{}')
        FROM pgoutbox.stream_page(b.queue, b.done_through, p_through, b.snap, b.prev_snap, p_limit, b.slot_lo,
            b.slot_hi) p);
END;
$$;
-- +goose StatementEnd

-- stream_page_firsts is the ids of p_page (a page, in id order) that may
-- run from the batch by their place in it: the first of their ordering
-- key, or without one. claim_batch returns only these, and settle_batch
-- accepts only these.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.stream_page_firsts(p_page pgoutbox.stream[]) RETURNS bigint[]
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(f.id ORDER BY f.id), '{}')
        FROM (SELECT p.id, p.ordering_key, row_number() OVER (PARTITION BY p.ordering_key ORDER BY p.id) AS rn
              FROM unnest(p_page) p) f
        WHERE f.ordering_key IS NULL OR f.rn = 1);
END;
$$;
-- +goose StatementEnd

-- claim_batch leases queue's next batch for worker and returns the
-- effects of its next page (at most max_effects) that the caller delivers
-- from the batch: of effect_types (replay-safe: a consumer that dies
-- before settle_batch has them delivered again), due, the first of their
-- ordering key in the page, not held by an effect of their key in
-- pgoutbox.effects. Every row carries the batch (batch_id, batch_token)
-- and the page's end (through) that settle_batch takes. No row: no batch
-- to deliver (a row storage queue, a paused one, every lane leased, or
-- nothing committed). Pages with nothing to deliver are settled here.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.claim_batch(queue text, worker text, effect_types text[], max_effects integer DEFAULT 100,
                                     lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (batch_id bigint, batch_token uuid, through bigint, id bigint, effect_type text,
               idempotency_key text, payload jsonb, attempt integer, max_attempts integer, created_at timestamptz,
               ordering_key text, traceparent text)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
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
       AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream_batches x WHERE x.queue = claim_batch.queue AND x.done_at IS NULL) THEN
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
        SELECT b.id, b.lease_token, v_through, p.id, p.effect_type, p.idempotency_key, p.payload, 1, p.max_attempts,
            p.created_at, p.ordering_key, p.traceparent
        FROM unnest(v_page) p WHERE p.id = ANY(v_run) ORDER BY p.id;
        RETURN;
    END LOOP;
END;
$$;
-- +goose StatementEnd

-- settle_batch records the page of queue's batch batch_id that claim_batch
-- returned (through: its end), fenced by batch_token, and releases the
-- lease: delivered are the effects delivered; failed, with outcomes
-- (retry, retry_after, permanent, ambiguous, release) and errors (and
-- retry_after, empty or one interval per failed effect), those that were
-- not; every other effect of the page moves unrun to the row storage. A
-- failed effect leaves for pgoutbox.effects: back to available after
-- backoff_cap's backoff (retry_after: no earlier than asked), to
-- dead_letter when permanent or out of attempts, unrun on release. false:
-- the lease was lost (another worker took the batch over), nothing
-- changed.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.settle_batch(queue text, batch_id bigint, batch_token uuid, through bigint, worker text,
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

-- extend_batch pushes the lease of a batch claim_batch leased to now() +
-- lease while its page's deliveries run. false: the lease was lost.
-- +goose StatementBegin
CREATE FUNCTION pgoutbox.extend_batch(queue text, batch_id bigint, batch_token uuid,
                                      lease interval DEFAULT interval '30 seconds') RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgoutbox.work_refuse_queue(pgoutbox.enqueue_caller(), extend_batch.queue);
    PERFORM pgoutbox.work_refuse_bound(extend_batch.lease NOT BETWEEN interval '1 second' AND interval '1 day', 'lease',
        'must be between 1 second and 1 day');
    RETURN EXISTS (SELECT FROM pgoutbox.work_extend_batch(extend_batch.queue, extend_batch.batch_id,
        extend_batch.batch_token, extract(epoch FROM extend_batch.lease)::float8));
END;
$$;
-- +goose StatementEnd

-- claim (migrations 00025, 00028) with from_stream: false claims rows only.
-- +goose StatementBegin
DROP FUNCTION pgoutbox.claim(text, text, integer, interval);
CREATE FUNCTION pgoutbox.claim(queue text, worker text, max_effects integer DEFAULT 1,
                               lease interval DEFAULT interval '30 seconds', from_stream boolean DEFAULT true)
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
-- +goose StatementEnd

-- may_work and stream_next_batch run their statements as PL/pgSQL: each
-- is created again from its definition with LANGUAGE plpgsql and its body
-- wrapped (RETURN QUERY for a set, RETURN for a value); the text of the
-- statement does not change.
-- +goose StatementBegin
DO $do$
DECLARE
    f     record;
    v_def text;
BEGIN
    FOR f IN
        SELECT p.oid, rtrim(btrim(p.prosrc, E' \n\t'), ';') AS body, p.proretset
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_catalog.pg_language l ON l.oid = p.prolang
        WHERE n.nspname = 'pgoutbox' AND l.lanname = 'sql'
          AND p.proname IN ('may_work', 'stream_next_batch')
    LOOP
        v_def := pg_catalog.pg_get_functiondef(f.oid);
        v_def := pg_catalog.replace(v_def, E'\n LANGUAGE sql\n', E'\n LANGUAGE plpgsql\n');
        v_def := pg_catalog.left(v_def, pg_catalog.strpos(v_def, E'\nAS $function$')) || 'AS ' || pg_catalog.quote_literal(
            CASE WHEN f.proretset THEN E'BEGIN\nRETURN QUERY\n' || f.body || E';\nEND;'
                 ELSE E'BEGIN\nRETURN (\n' || f.body || E');\nEND;' END);
        EXECUTE v_def;
    END LOOP;
END;
$do$;
-- +goose StatementEnd

REVOKE EXECUTE ON FUNCTION pgoutbox.work_claim_batch(text, text, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_held_keys(text, text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_settle_batch_row(text, bigint, uuid, bigint, boolean, text[], bigint[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_move_rows(bigint[], text[], integer[], float8[], text[], text, text, uuid[],
    float8[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_page_settled(text, text[], bigint[], float8[], float8[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_release_batch(text, bigint, uuid) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.work_extend_batch(text, bigint, uuid, float8) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.stream_settle_page(text, bigint, uuid, bigint, boolean, text, pgoutbox.stream[],
    bigint[], bigint[], text[], integer[], float8[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.stream_page_of(pgoutbox.stream_batches, bigint, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.stream_page_firsts(pgoutbox.stream[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.claim_batch(text, text, text[], integer, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.settle_batch(text, bigint, uuid, bigint, text, bigint[], bigint[], text[], text[],
    interval[], interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.extend_batch(text, bigint, uuid, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval, boolean) FROM PUBLIC;

-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_worker') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.claim_batch(text, text, text[], integer, interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.settle_batch(text, bigint, uuid, bigint, text, bigint[], bigint[], text[],
            text[], interval[], interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.extend_batch(text, bigint, uuid, interval) TO pgoutbox_worker;
        GRANT EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval, boolean) TO pgoutbox_worker;
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
        SELECT p.oid, p.prosrc
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        JOIN pg_catalog.pg_language l ON l.oid = p.prolang
        WHERE n.nspname = 'pgoutbox' AND l.lanname = 'plpgsql'
          AND p.proname IN ('may_work', 'stream_next_batch')
    LOOP
        v_def := pg_catalog.pg_get_functiondef(f.oid);
        v_def := pg_catalog.replace(v_def, E'\n LANGUAGE plpgsql\n', E'\n LANGUAGE sql\n');
        v_def := pg_catalog.left(v_def, pg_catalog.strpos(v_def, E'\nAS $function$')) || 'AS ' || pg_catalog.quote_literal(
            CASE WHEN f.prosrc LIKE E'BEGIN\nRETURN QUERY\n%' THEN pg_catalog.substr(f.prosrc, 20, pg_catalog.length(f.prosrc) - 25)
                 ELSE pg_catalog.substr(f.prosrc, 16, pg_catalog.length(f.prosrc) - 22) END);
        EXECUTE v_def;
    END LOOP;
END;
$do$;
-- +goose StatementEnd
-- +goose StatementBegin
DROP FUNCTION pgoutbox.claim(text, text, integer, interval, boolean);
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
    PERFORM pgoutbox.stream_to_rows(claim.queue, claim.max_effects);
    RETURN QUERY
    SELECT c.r_id, c.r_effect_type, c.r_key, c.r_payload, c.r_attempts, c.r_max_attempts, c.r_token,
        c.r_created_at, c.r_delivery_started_at, nullif(c.r_ordering_key, ''), nullif(c.r_traceparent, '')
    FROM pgoutbox.work_claim_rows(claim.queue, claim.max_effects, claim.worker,
        extract(epoch FROM claim.lease)::float8, 1) c;
END;
$$;
-- +goose StatementEnd
REVOKE EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval) FROM PUBLIC;
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgoutbox_worker') THEN
        GRANT EXECUTE ON FUNCTION pgoutbox.claim(text, text, integer, interval) TO pgoutbox_worker;
    END IF;
END;
$$;
-- +goose StatementEnd
DROP FUNCTION pgoutbox.extend_batch(text, bigint, uuid, interval);
DROP FUNCTION pgoutbox.settle_batch(text, bigint, uuid, bigint, text, bigint[], bigint[], text[], text[], interval[],
    interval);
DROP FUNCTION pgoutbox.claim_batch(text, text, text[], integer, interval);
DROP FUNCTION pgoutbox.stream_page_firsts(pgoutbox.stream[]);
DROP FUNCTION pgoutbox.stream_page_of(pgoutbox.stream_batches, bigint, integer);
DROP FUNCTION pgoutbox.stream_settle_page(text, bigint, uuid, bigint, boolean, text, pgoutbox.stream[], bigint[],
    bigint[], text[], integer[], float8[], text[]);
DROP FUNCTION pgoutbox.work_extend_batch(text, bigint, uuid, float8);
DROP FUNCTION pgoutbox.work_release_batch(text, bigint, uuid);
DROP FUNCTION pgoutbox.work_page_settled(text, text[], bigint[], float8[], float8[]);
DROP FUNCTION pgoutbox.work_move_rows(bigint[], text[], integer[], float8[], text[], text, text, uuid[], float8[]);
DROP FUNCTION pgoutbox.work_settle_batch_row(text, bigint, uuid, bigint, boolean, text[], bigint[]);
DROP FUNCTION pgoutbox.work_held_keys(text, text[]);
DROP FUNCTION pgoutbox.work_claim_batch(text, text, float8);
