package store

// The operator statements (docs/operations.md): aggregate statistics,
// dead-letter listing and replay, stale-lease requeue, the oldest-xmin probe,
// the aggregate samples read by `readiness broker`, and compaction.
//
// Every operator filter (queue, effect type, ids) is a bind parameter; an
// empty string or an empty array means "any". Nothing here is built by
// string concatenation.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// OpsFilter narrows an operator statement. Empty fields match everything;
// values are compared literally (they are bind parameters).
type OpsFilter struct {
	Queue string
	Type  string
}

// StatsRow is one group of the aggregate statistics: a queue, an effect type
// (empty on a queue's total row) and a state.
type StatsRow struct {
	Queue string
	// Type is empty when QueueTotal is set: the row sums every type of the
	// queue in that state.
	Type       string
	QueueTotal bool
	State      string
	// Count of effects in the state; for "completed", only those completed
	// within the lag window.
	Count int64
	// Retrying counts available effects with attempts > 0.
	Retrying int64
	// Parked counts available effects the sweeper parked behind their
	// ordering key's blocked head (parked_due_at set, migration 00014).
	Parked int64
	// OldestAvailableAge is now() minus the oldest available_at among
	// available effects that are due (available_at <= now()), in seconds.
	OldestAvailableAge float64
	// StalledLeases counts leases taken more than the stalled age ago.
	StalledLeases int64
	// LagP50 and LagP99 are percentiles of completed_at - created_at over the
	// completions within the lag window, in seconds (completed rows only).
	LagP50, LagP99 *float64
}

// settledChunkEndSQL is the last id of the chunk of 1,024 ids (stream_tick's
// chunk_ends, migration 00035) that holds batch b's settled position:
// statsSQL reads that chunk's unsettled rows and takes the chunks after it
// from their recorded earliest available_at.
const settledChunkEndSQL = `(b.done_through | 1023::bigint)`

// statsSQL is the one aggregate query behind `status`, `alert check` and the
// /metrics gauges. Each OR arm of the WHERE clause matches the predicate of
// a partial index (claims, lease expiry, attention, completed_at), so the
// cost follows the live backlog and the lag window, not the retained history.
// Batch queues' stream effects still to deliver are counted per open batch
// and type (migration 00030): what the tick counted less what the
// batch's settles passed (n), with the earliest available_at the tick saw;
// rows are read only where those counts do not tell: the rows committed
// after each queue's newest batch (not ticked yet), the unsettled rows of
// an open batch ticked before 00030 (no counts), and of one partially
// settled and not leased, whose earliest available_at per type comes from
// the chunks of 1,024 ids its tick recorded (migration 00035), the rest of
// the chunk that holds its settled position (every unsettled row, for a
// batch ticked before 00035). So a status reads O(open batches + rows not
// ticked), not O(pending effects). Their completions come from
// pgoutbox.stream_settled, one row per settled page and type (n: its
// count; lag50 and lag99: its percentiles, so a queue's lag percentiles
// mix the pages' percentiles with the rows' lags).
const statsSQL = `
SELECT queue, coalesce(effect_type, ''), grouping(effect_type) = 1, state::text,
    sum(n)::bigint,
    count(*) FILTER (WHERE state = 'available' AND attempts > 0),
    count(*) FILTER (WHERE state = 'available' AND parked_due_at IS NOT NULL),
    coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE state = 'available' AND available_at <= now())), 0)::float8,
    count(*) FILTER (WHERE state = 'leased' AND leased_at <= now() - make_interval(secs => $3)),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY lag50) FILTER (WHERE state = 'completed'),
    percentile_cont(0.99) WITHIN GROUP (ORDER BY lag99) FILTER (WHERE state = 'completed')
FROM (
    SELECT queue, effect_type, state, attempts, parked_due_at, available_at, leased_at, 1 AS n,
        extract(epoch FROM completed_at - created_at)::float8 AS lag50,
        extract(epoch FROM completed_at - created_at)::float8 AS lag99
    FROM pgoutbox.effects
    WHERE (state = 'available'
           OR state = 'leased'
           OR state IN ('dead_letter', 'reconciliation_required')
           OR (state = 'completed' AND completed_at >= now() - make_interval(secs => $4)))
      AND ($1::text = '' OR queue = $1) AND ($2::text = '' OR effect_type = $2)
    UNION ALL
    -- Batch storage's effects still to deliver (migrations 00027, 00030):
    -- per open batch and type, from its counts,
    -- (the earliest available_at the tick saw while nothing is settled),
    SELECT b.queue, t.effect_type, (CASE WHEN l.leased THEN 'leased' ELSE 'available' END)::pgoutbox.effect_state,
        0, NULL::timestamptz, CASE WHEN l.leased OR b.done_through < b.min_id THEN t.available_at END,
        NULL::timestamptz, t.effects - t.passed, NULL, NULL
    FROM pgoutbox.stream_batches b
    CROSS JOIN LATERAL (SELECT b.lease_token IS NOT NULL AND b.lease_expires_at > now() AS leased) l
    CROSS JOIN LATERAL unnest(b.type_names, b.type_effects, b.type_passed, b.type_available_at)
        AS t(effect_type, effects, passed, available_at)
    WHERE b.done_at IS NULL AND b.type_names IS NOT NULL
      AND (l.leased OR b.done_through < b.min_id OR b.chunk_types IS NOT NULL)
      AND t.effects > t.passed
      AND ($1::text = '' OR b.queue = $1) AND ($2::text = '' OR t.effect_type = $2)
    UNION ALL
    -- the earliest available_at of each chunk past a partial settle
    -- (migration 00035; counting nothing),
    SELECT b.queue, c.effect_type, 'available'::pgoutbox.effect_state, 0, NULL::timestamptz, c.available_at,
        NULL::timestamptz, 0, NULL, NULL
    FROM pgoutbox.stream_batches b
    CROSS JOIN LATERAL (SELECT b.lease_token IS NOT NULL AND b.lease_expires_at > now() AS leased) l
    CROSS JOIN LATERAL unnest(b.chunk_types, b.chunk_ends, b.chunk_available_at) AS c(effect_type, chunk_end, available_at)
    WHERE b.done_at IS NULL AND b.chunk_types IS NOT NULL AND NOT l.leased AND b.done_through >= b.min_id
      AND c.chunk_end > ` + settledChunkEndSQL + `
      AND ($1::text = '' OR b.queue = $1) AND ($2::text = '' OR c.effect_type = $2)
    UNION ALL
    -- and its unsettled rows where the counts do not tell: every one of a
    -- batch without counts or chunks, the rest of the chunk that holds a
    -- partial settle's position of one with chunks (counting nothing),
    SELECT b.queue, s.effect_type, (CASE WHEN l.leased THEN 'leased' ELSE 'available' END)::pgoutbox.effect_state,
        0, NULL::timestamptz, s.available_at, NULL::timestamptz, CASE WHEN b.chunk_types IS NULL THEN 1 ELSE 0 END,
        NULL, NULL
    FROM pgoutbox.stream_batches b
    CROSS JOIN LATERAL (SELECT b.lease_token IS NOT NULL AND b.lease_expires_at > now() AS leased) l
    CROSS JOIN LATERAL pgoutbox.stream_page(b.queue, b.done_through,
        CASE WHEN b.chunk_types IS NULL THEN b.max_id ELSE least(b.max_id, ` + settledChunkEndSQL + `) END,
        b.snap, b.prev_snap, NULL, b.slot_lo, b.slot_hi) s
    WHERE b.done_at IS NULL AND (b.type_names IS NULL OR (NOT l.leased AND b.done_through >= b.min_id))
      AND ($1::text = '' OR b.queue = $1) AND ($2::text = '' OR s.effect_type = $2)
    UNION ALL
    -- and the rows committed after each queue's newest batch.
    SELECT q.queue, s.effect_type, 'available'::pgoutbox.effect_state, 0, NULL::timestamptz, s.available_at,
        NULL::timestamptz, 1, NULL, NULL
    FROM pgoutbox.queue_storage q
    LEFT JOIN LATERAL (
        SELECT n.snap FROM pgoutbox.stream_batches n WHERE n.queue = q.queue ORDER BY n.id DESC LIMIT 1
    ) newest ON true
    CROSS JOIN LATERAL pgoutbox.stream_after(q.queue, newest.snap) s
    WHERE ($1::text = '' OR q.queue = $1) AND ($2::text = '' OR s.effect_type = $2)
    UNION ALL
    -- And its completions (migration 00028).
    SELECT queue, effect_type, 'completed'::pgoutbox.effect_state, 0, NULL::timestamptz, NULL::timestamptz,
        NULL::timestamptz, completed, lag_p50, lag_p99
    FROM pgoutbox.stream_settled
    WHERE settled_at >= now() - make_interval(secs => $4)
      AND ($1::text = '' OR queue = $1) AND ($2::text = '' OR effect_type = $2)
) e
GROUP BY GROUPING SETS ((queue, effect_type, state), (queue, state))
ORDER BY queue, grouping(effect_type) DESC, effect_type, state`

// Stats runs the aggregate query. stalledAfter is the lease age from which
// a lease counts as stalled; lagWindow bounds the completions counted and
// the lag percentiles.
//
// It runs with jit off (withoutJIT): its stream arms are estimated far
// above their cost (compiling the former pgoutbox.stream_pending arm took
// 1.3 of the 1.5 s a status of 50,000 pending stream effects took, every
// sampler tick).
func Stats(ctx context.Context, db DBTX, f OpsFilter, stalledAfter, lagWindow time.Duration) ([]StatsRow, error) {
	var out []StatsRow
	err := withoutJIT(ctx, db, func(q DBTX) error {
		rows, err := q.Query(ctx, statsSQL, f.Queue, f.Type, stalledAfter.Seconds(), lagWindow.Seconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StatsRow, error) {
			var s StatsRow
			err := r.Scan(&s.Queue, &s.Type, &s.QueueTotal, &s.State, &s.Count, &s.Retrying, &s.Parked,
				&s.OldestAvailableAge, &s.StalledLeases, &s.LagP50, &s.LagP99)
			return s, err
		})
		return err
	})
	return out, MapError(err)
}

// horizonSQL reads the database clock and finds the client backend of this
// database whose snapshot (backend_xmin) or transaction id (backend_xid) has
// been held longest: it keeps VACUUM from removing the dead tuples every
// effect transition leaves. Other databases of the cluster do not hold back
// this database's horizon. Seeing other roles' sessions needs
// pg_read_all_stats (or pg_monitor).
const horizonSQL = `
SELECT now(), coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8, count(*)
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)`

// Horizon is the database clock and the oldest transaction holding back the
// xmin horizon.
type Horizon struct {
	Now time.Time
	// OldestXminAge is the age in seconds of the oldest transaction holding
	// back this database's xmin horizon (0 when none).
	OldestXminAge float64
	// Holders counts the transactions that hold one.
	Holders int64
}

// ReadHorizon reads the database clock and the xmin horizon's oldest holder.
func ReadHorizon(ctx context.Context, db DBTX) (Horizon, error) {
	var h Horizon
	err := db.QueryRow(ctx, horizonSQL).Scan(&h.Now, &h.OldestXminAge, &h.Holders)
	return h, MapError(err)
}

// DeadLetter is one dead-lettered effect as listed to an operator (no
// payload).
type DeadLetter struct {
	ID             int64
	Queue          string
	Type           string
	Attempts       int
	MaxAttempts    int
	LastError      string
	DeadLetteredAt *time.Time
	CreatedAt      time.Time
	// Subject is the JSON object of the payload's SubjectKeys that hold a
	// string or a number (SubjectSQL); never anything else of the payload.
	Subject []byte
}

// SubjectKeys are the payload keys that name what an effect is about: the
// projection's record, the control plane's repository, release run and
// execution attempt (ids and number) and workflow run. Operator listings
// show them; no other payload key ever leaves the database for a listing.
var SubjectKeys = []string{"record_id", "repository", "release_run_id", "execution_attempt_id", "attempt_number", "workflow_run_id"}

// SubjectSQL is the SQL expression of a payload's subject: an object of
// the SubjectKeys whose values are strings or numbers ({} for any other
// payload: -> on an array or a scalar is NULL).
const SubjectSQL = `jsonb_strip_nulls(jsonb_build_object(
    'record_id', CASE WHEN jsonb_typeof(payload->'record_id') IN ('string', 'number') THEN payload->'record_id' END,
    'repository', CASE WHEN jsonb_typeof(payload->'repository') IN ('string', 'number') THEN payload->'repository' END,
    'release_run_id', CASE WHEN jsonb_typeof(payload->'release_run_id') IN ('string', 'number') THEN payload->'release_run_id' END,
    'execution_attempt_id', CASE WHEN jsonb_typeof(payload->'execution_attempt_id') IN ('string', 'number') THEN payload->'execution_attempt_id' END,
    'attempt_number', CASE WHEN jsonb_typeof(payload->'attempt_number') IN ('string', 'number') THEN payload->'attempt_number' END,
    'workflow_run_id', CASE WHEN jsonb_typeof(payload->'workflow_run_id') IN ('string', 'number') THEN payload->'workflow_run_id' END))`

const deadLettersSQL = `
SELECT id, queue, effect_type, attempts, max_attempts, coalesce(last_error, ''), dead_lettered_at, created_at,
    ` + SubjectSQL + `
FROM pgoutbox.effects
WHERE state = 'dead_letter' AND ($1::text = '' OR queue = $1) AND ($2::text = '' OR effect_type = $2) AND id > $3
ORDER BY id
LIMIT $4`

// DeadLetters lists up to limit dead letters with id > afterID, by id (keyset
// paging).
func DeadLetters(ctx context.Context, db DBTX, f OpsFilter, afterID int64, limit int) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, deadLettersSQL, f.Queue, f.Type, afterID, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Queue, &d.Type, &d.Attempts, &d.MaxAttempts, &d.LastError, &d.DeadLetteredAt, &d.CreatedAt, &d.Subject)
		return d, err
	})
	return out, MapError(err)
}

// Moved is an effect an operator statement changed.
type Moved struct {
	ID    int64
	Queue string
	Type  string
	// State is the state it was moved to.
	State string
	// Owner and HeldFor describe the abandoned lease (requeue only).
	Owner   string
	HeldFor float64
}

// replaySQL runs pgoutbox.replay_dead_letters (migration 00016), in the
// shape collectMoved scans.
const replaySQL = `
SELECT r.id, r.queue, r.effect_type, r.state, '', 0::float8
FROM pgoutbox.replay_dead_letters($1::bigint[], $2::text, $3::text, $4::int) r`

// ReplayDeadLetters moves up to limit dead letters (all, or those in ids,
// narrowed by f) back to available with fresh attempts, oldest id first. Only
// dead_letter rows match: reconciliation records are never touched. Run it in
// a transaction with NotifyQueues so workers wake at once.
//
// A replayed move-on dead letter (EffectType.OrderingMovesOn) goes back to
// the head of its key, ahead of the effects that overtook it and are not
// completed, but after the one of them in delivery, if any: the claim skips
// it while a later effect of its key is leased (notOvertakenSQL), and for a
// delivery under a row lock, which leaves its row available, the replay
// waits until that claim transaction has ended (at most the queue's
// RowLockLease) and holds a key-share lock on the key's first blocking
// effect after the dead letter until it commits, so no claim takes it
// meanwhile; it also holds the ordering locks of those keys, so ordered
// enqueues to them wait for the replay. In a batch queue the later effect
// may run from a batch page and have no row: the replay share-locks the
// queue's oldest open batch (no page starts or settles until it commits)
// and, when that batch is leased, records a barrier that keeps the claim
// off the dead letter until the page in flight settles
// (notBehindBatchSQL, migration 00029).
func ReplayDeadLetters(ctx context.Context, db DBTX, ids []int64, f OpsFilter, limit int) ([]Moved, error) {
	if ids == nil {
		ids = []int64{}
	}
	return collectMoved(db.Query(ctx, replaySQL, ids, f.Queue, f.Type, limit))
}

const requeueSQL = `
WITH stale AS (
    SELECT id FROM pgoutbox.effects
    WHERE state = 'leased' AND leased_at <= now() - make_interval(secs => $1)
      AND ($2::text = '' OR queue = $2) AND ($3::text = '' OR effect_type = $3)
    ORDER BY leased_at, id
    LIMIT $4
    FOR UPDATE SKIP LOCKED
), held AS (
    -- Owner and age of the abandoned lease, for the operator's report
    -- only: the route below reads the locked row itself.
    SELECT e.id, coalesce(e.lease_owner, '') AS owner, extract(epoch FROM now() - e.leased_at)::float8 AS held_for
    FROM pgoutbox.effects e JOIN stale USING (id)
)
UPDATE pgoutbox.effects e
SET ` + recoverSet + `,
    last_error = 'requeued by an operator: lease stalled (owner ' || coalesce(e.lease_owner, '?') || ')'
FROM held h
WHERE e.id = h.id AND e.state::text = 'leased'
RETURNING e.id, e.queue, e.effect_type, e.state::text, h.owner, h.held_for`

// RequeueStale recovers up to limit leases taken more than stalledAfter ago
// (database clock), with the sweeper's routing (pgoutbox.recovered_state of
// the locked row, recoverSet): a started non-replay-safe effect goes to
// reconciliation_required, an exhausted one to dead_letter, any other back
// to available. It takes live leases too (a stalled worker's lease is kept
// alive by its extender), so a worker may commit delivery_started_at
// between this statement's snapshot and its lock: the route reads the
// locked row, which already carries it. The lease
// token is cleared, so the stalled worker's writes are fenced off.
func RequeueStale(ctx context.Context, db DBTX, stalledAfter time.Duration, f OpsFilter, limit int) ([]Moved, error) {
	return collectMoved(db.Query(ctx, requeueSQL, stalledAfter.Seconds(), f.Queue, f.Type, limit))
}

func collectMoved(rows pgx.Rows, err error) ([]Moved, error) {
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Moved, error) {
		var m Moved
		err := r.Scan(&m.ID, &m.Queue, &m.Type, &m.State, &m.Owner, &m.HeldFor)
		return m, err
	})
	return out, MapError(err)
}

const statesSQL = `SELECT id, state::text FROM pgoutbox.effects WHERE id = ANY($1::bigint[])`

// States returns the state of each existing effect among ids.
func States(ctx context.Context, db DBTX, ids []int64) (map[int64]string, error) {
	rows, err := db.Query(ctx, statesSQL, ids)
	if err != nil {
		return nil, MapError(err)
	}
	out := make(map[int64]string, len(ids))
	var id int64
	var state string
	_, err = pgx.ForEachRow(rows, []any{&id, &state}, func() error {
		out[id] = state
		return nil
	})
	return out, MapError(err)
}

// NotifyQueues wakes the workers of queues (one NOTIFY each on
// NotifyChannel, delivered when the transaction commits).
func NotifyQueues(ctx context.Context, db DBTX, queues []string) error {
	_, err := db.Exec(ctx, `SELECT pg_notify($1, q) FROM (SELECT DISTINCT unnest($2::text[]) AS q) qs`,
		NotifyChannel, queues)
	return MapError(err)
}

// Sample is one worker's aggregate over one interval for one queue.
type Sample struct {
	Queue       string
	Worker      string
	Interval    time.Duration
	Claims      int64
	Completions int64
	Failures    int64
	// ClaimLatencyP99 is nil when nothing was claimed in the interval.
	ClaimLatencyP99    *time.Duration
	OldestAvailableAge time.Duration
	Healthy            bool
}

const insertSamplesSQL = `
INSERT INTO pgoutbox.samples (sampled_at, queue, worker, interval_s, claims, completions, failures,
    claim_latency_p99_ms, oldest_available_age_s, completed_per_second, workers_healthy)
SELECT now(), queue, worker, interval_s, claims, completions, failures, p99_ms, oldest_s,
    completions / interval_s, healthy
FROM unnest($1::text[], $2::text[], $3::float8[], $4::bigint[], $5::bigint[], $6::bigint[],
            $7::float8[], $8::float8[], $9::bool[])
    AS t(queue, worker, interval_s, claims, completions, failures, p99_ms, oldest_s, healthy)
ON CONFLICT (sampled_at, queue, worker) DO NOTHING`

// InsertSamples writes samples stamped with the database's now().
func InsertSamples(ctx context.Context, db DBTX, samples []Sample) error {
	n := len(samples)
	queues, workers := make([]string, n), make([]string, n)
	intervals, p99s, oldest := make([]float64, n), make([]*float64, n), make([]float64, n)
	claims, completions, failures := make([]int64, n), make([]int64, n), make([]int64, n)
	healthy := make([]bool, n)
	for i, s := range samples {
		queues[i], workers[i], intervals[i] = s.Queue, s.Worker, s.Interval.Seconds()
		claims[i], completions[i], failures[i] = s.Claims, s.Completions, s.Failures
		if s.ClaimLatencyP99 != nil {
			ms := float64(*s.ClaimLatencyP99) / float64(time.Millisecond)
			p99s[i] = &ms
		}
		oldest[i], healthy[i] = s.OldestAvailableAge.Seconds(), s.Healthy
	}
	_, err := db.Exec(ctx, insertSamplesSQL, queues, workers, intervals, claims, completions, failures, p99s, oldest, healthy)
	return MapError(err)
}

// PruneSamples deletes samples older than retention and returns how many.
func PruneSamples(ctx context.Context, db DBTX, retention time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, `DELETE FROM pgoutbox.samples WHERE sampled_at < now() - make_interval(secs => $1)`,
		retention.Seconds())
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

// StoredSample is a sample read back, with its age on the database clock.
type StoredSample struct {
	Sample
	// Age is now() - sampled_at.
	Age time.Duration
}

const recentSamplesSQL = `
SELECT queue, worker, extract(epoch FROM now() - sampled_at)::float8, interval_s, claims, completions, failures,
    claim_latency_p99_ms, coalesce(oldest_available_age_s, 0), workers_healthy
FROM pgoutbox.samples
WHERE sampled_at > now() - make_interval(secs => $1) AND sampled_at <= now() AND ($2::text = '' OR queue = $2)
ORDER BY sampled_at, queue, worker`

// RecentSamples returns the samples of the last window (database clock),
// oldest first, optionally of one queue.
func RecentSamples(ctx context.Context, db DBTX, window time.Duration, queue string) ([]StoredSample, error) {
	rows, err := db.Query(ctx, recentSamplesSQL, window.Seconds(), queue)
	if err != nil {
		return nil, MapError(err)
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StoredSample, error) {
		var s StoredSample
		var age, interval, oldest float64
		var p99 *float64
		err := r.Scan(&s.Queue, &s.Worker, &age, &interval, &s.Claims, &s.Completions, &s.Failures,
			&p99, &oldest, &s.Healthy)
		s.Age, s.Interval, s.OldestAvailableAge = secs(age), secs(interval), secs(oldest)
		if p99 != nil {
			d := time.Duration(*p99 * float64(time.Millisecond))
			s.ClaimLatencyP99 = &d
		}
		return s, err
	})
	return out, MapError(err)
}

// IsUndefinedTable reports whether err says a table is missing (the schema
// was not migrated).
func IsUndefinedTable(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "42P01"
}

// EngineTables are the engine's tables that grow with traffic: what
// `pgoutbox compact` rebuilds.
var EngineTables = []string{"pgoutbox.effects", "pgoutbox.effect_keys"}

// RelationSize is the on-disk size of one relation: a table (heap and TOAST)
// or one of its indexes.
type RelationSize struct {
	Name  string
	Table string // the table an index belongs to; equal to Name for a table
	Bytes int64
}

const relationSizesSQL = `
SELECT c.oid::regclass::text, t.oid::regclass::text,
    CASE WHEN c.relkind = 'i' THEN pg_relation_size(c.oid) ELSE pg_table_size(c.oid) END
FROM pg_class t
JOIN pg_class c ON c.oid = t.oid OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = t.oid)
WHERE t.oid = ANY($1::regclass[])
ORDER BY t.oid::regclass::text, c.relkind DESC, c.oid::regclass::text`

// RelationSizes lists tables and each of their indexes with their sizes.
func RelationSizes(ctx context.Context, db DBTX, tables []string) ([]RelationSize, error) {
	rows, err := db.Query(ctx, relationSizesSQL, tables)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RelationSize, error) {
		var x RelationSize
		err := r.Scan(&x.Name, &x.Table, &x.Bytes)
		return x, err
	})
	return out, MapError(err)
}

// Compact returns the space a table's emptied pages hold to the operating
// system without blocking readers or writers: VACUUM truncates the heap's
// empty tail, and REINDEX CONCURRENTLY rebuilds every index (a btree page
// emptied by VACUUM is reused by later inserts but never returned). table is
// one of EngineTables. It must not run in a transaction; it waits for the
// transactions that were running when each step began.
func Compact(ctx context.Context, db DBTX, table string) error {
	if !slices.Contains(EngineTables, table) {
		return fmt.Errorf("store: %q is not an engine table", table)
	}
	// The name is one of EngineTables (checked above), not user input:
	// VACUUM and REINDEX take no bind parameters.
	for _, stmt := range []string{"VACUUM " + table, "REINDEX TABLE CONCURRENTLY " + table} {
		if _, err := db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("store: %s: %w", stmt, MapError(err))
		}
	}
	return nil
}
