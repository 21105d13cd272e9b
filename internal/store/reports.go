package store

// The read-only statements of the applications and tools built on the
// engine: the projection's key look-up and backlog (through the root's
// KeysPastAvailable and QueueBacklog), the /workers report
// (internal/console), the demo's run summary, and `pgoutbox bench`'s
// measurements and clean-up.
// They live here so that every statement against pgoutbox.effects and
// pgoutbox.effect_keys has one home (docs/design.md, "The house's map").

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// keysPastAvailableSQL returns those of $2 that name an effect of queue $1
// which is no longer available (delivered, in flight, dead-lettered or
// awaiting reconciliation): per key, one probe of effect_keys' primary key
// and one of the effects', in a LATERAL subquery whose LIMIT keeps the
// planner from turning it into a join of the tables. Written as a join,
// the statement took about 2 s a batch of 500 keys in a growing
// projection import on the shared test server (autovacuum off), which then
// timed out at 100,000 records; the plan it ran was not captured (a fresh
// EXPLAIN of it was fast). In this form the import takes 42 s.
const keysPastAvailableSQL = `
SELECT t.key FROM unnest($2::text[]) AS t(key)
CROSS JOIN LATERAL (
    SELECT 1 FROM pgoutbox.effect_keys k
    JOIN pgoutbox.effects e ON e.id = k.effect_id
    WHERE k.queue = $1 AND k.idempotency_key = t.key AND e.state <> 'available'
    LIMIT 1
) x`

// KeysPastAvailable returns the keys among keys that name an effect of queue
// that has left the available state (it was delivered, or is being
// delivered, or needs an operator). Keys naming no effect, or an effect
// still waiting to be claimed, are not returned. The order is unspecified.
func KeysPastAvailable(ctx context.Context, db DBTX, queue string, keys []string) ([]string, error) {
	rows, err := db.Query(ctx, keysPastAvailableSQL, queue, keys)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, MapError(err)
}

// backlogSQL counts one queue's effects still to deliver, through the claim
// and lease-expiry indexes.
const backlogSQL = `
SELECT count(*) FILTER (WHERE state = 'available'),
       count(*) FILTER (WHERE state = 'available' AND available_at <= now()),
       count(*) FILTER (WHERE state = 'leased')
FROM pgoutbox.effects WHERE queue = $1 AND state IN ('available', 'leased')`

// Backlog is what one queue still has to deliver.
type Backlog struct {
	// Available counts available effects, including retries and scheduled
	// effects that are not yet due.
	Available int64
	// Ready counts the available effects that are due (available_at <=
	// now(), database clock): claimable now.
	Ready int64
	// Leased counts effects under a lease.
	Leased int64
}

// QueueBacklog counts queue's available (and, of those, due) and leased
// effects.
func QueueBacklog(ctx context.Context, db DBTX, queue string) (Backlog, error) {
	var b Backlog
	err := db.QueryRow(ctx, backlogSQL, queue).Scan(&b.Available, &b.Ready, &b.Leased)
	return b, MapError(err)
}

// oldestPendingAgeSQL is the age of the oldest effect of queue $1 still to
// deliver (0 when none).
const oldestPendingAgeSQL = `
SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM pgoutbox.effects
WHERE queue = $1 AND state IN ('available', 'leased')`

// OldestPendingAge returns now() minus the creation time of queue's oldest
// available or leased effect, in seconds (0 when the queue has none).
func OldestPendingAge(ctx context.Context, db DBTX, queue string) (float64, error) {
	var age float64
	err := db.QueryRow(ctx, oldestPendingAgeSQL, queue).Scan(&age)
	return age, MapError(err)
}

// throughputSQL is, per queue, what completed in the last $1 seconds and
// its mean lag (creation to completion), through effects_completed_idx.
const throughputSQL = `
SELECT queue, count(*), coalesce(avg(extract(epoch FROM completed_at - created_at)), 0)::float8
FROM pgoutbox.effects
WHERE state = 'completed' AND completed_at > now() - make_interval(secs => $1)
GROUP BY queue`

// QueueThroughput is one queue's completions over a window.
type QueueThroughput struct {
	Queue string
	// Completed counts the effects completed within the window.
	Completed int64
	// MeanLag is the mean of completed_at - created_at over them, in
	// seconds.
	MeanLag float64
}

// Throughput returns, for every queue that completed an effect within the
// last window (database clock), the count and the mean lag. Queues with no
// completion in the window are absent.
func Throughput(ctx context.Context, db DBTX, window time.Duration) ([]QueueThroughput, error) {
	rows, err := db.Query(ctx, throughputSQL, window.Seconds())
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueThroughput, error) {
		var q QueueThroughput
		err := r.Scan(&q.Queue, &q.Completed, &q.MeanLag)
		return q, err
	})
	return out, MapError(err)
}

// attentionSQL lists dead letters and reconciliation records with their
// last errors (never payloads), newest first, through effects_attention_idx.
const attentionSQL = `
SELECT id, queue, effect_type, state::text, attempts, coalesce(last_error, ''),
       coalesce(dead_lettered_at, reconciliation_at, available_at)
FROM pgoutbox.effects
WHERE state IN ('dead_letter', 'reconciliation_required')
ORDER BY coalesce(dead_lettered_at, reconciliation_at) DESC NULLS LAST, id DESC
LIMIT $1`

// AttentionRecord is an effect that needs an operator: a dead letter or a
// reconciliation record (no payload).
type AttentionRecord struct {
	ID       int64
	Queue    string
	Type     string
	State    string
	Attempts int
	// LastError is the last recorded error ("" when none).
	LastError string
	// Since is when it entered its state (dead_lettered_at or
	// reconciliation_at; available_at for a row that has neither).
	Since time.Time
}

// Attention lists up to limit effects that need an operator, most recent
// first.
func Attention(ctx context.Context, db DBTX, limit int) ([]AttentionRecord, error) {
	rows, err := db.Query(ctx, attentionSQL, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AttentionRecord, error) {
		var a AttentionRecord
		err := r.Scan(&a.ID, &a.Queue, &a.Type, &a.State, &a.Attempts, &a.LastError, &a.Since)
		return a, err
	})
	return out, MapError(err)
}

// createdSinceSQL counts the effects created at or after $1 by queue and
// state.
const createdSinceSQL = `
SELECT queue, state::text, count(*) FROM pgoutbox.effects
WHERE created_at >= $1 GROUP BY 1, 2 ORDER BY 1, 2`

// StateCount is the number of effects of one queue in one state.
type StateCount struct {
	Queue string
	State string
	Count int64
}

// CountCreatedSince counts the effects created at or after since, by queue
// and state, ordered by queue then state. It reads every effect of the
// table (there is no index on created_at): it is for the demo's one run,
// not for a production dashboard.
func CountCreatedSince(ctx context.Context, db DBTX, since time.Time) ([]StateCount, error) {
	rows, err := db.Query(ctx, createdSinceSQL, since)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (StateCount, error) {
		var c StateCount
		err := r.Scan(&c.Queue, &c.State, &c.Count)
		return c, err
	})
	return out, MapError(err)
}

// completionLagSinceSQL is the median and 99th percentile of completed_at -
// created_at, in milliseconds, over the effects created at or after $1 and
// completed by a delivery (resolution IS NULL: not closed by an operator).
const completionLagSinceSQL = `
SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at)), 0) * 1000,
       coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM completed_at - created_at)), 0) * 1000
FROM pgoutbox.effects WHERE created_at >= $1 AND state = 'completed' AND resolution IS NULL`

// CompletionLagSince returns the median and 99th-percentile lag (creation
// to completion), in milliseconds, of the effects created at or after since
// that a delivery completed (an operator's resolution is not counted); both
// are 0 when there is none.
func CompletionLagSince(ctx context.Context, db DBTX, since time.Time) (p50ms, p99ms float64, err error) {
	err = db.QueryRow(ctx, completionLagSinceSQL, since).Scan(&p50ms, &p99ms)
	return p50ms, p99ms, MapError(err)
}

// latestInStateSQL is the highest id of effect type $1 in state $2 created
// at or after $3 (0 when none).
const latestInStateSQL = `
SELECT coalesce(max(id), 0) FROM pgoutbox.effects
WHERE effect_type = $1 AND state = $2::pgoutbox.effect_state AND created_at >= $3`

// LatestInState returns the id of the newest effect of effectType in state
// created at or after since, or 0 when there is none.
func LatestInState(ctx context.Context, db DBTX, effectType, state string, since time.Time) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, latestInStateSQL, effectType, state, since).Scan(&id)
	return id, MapError(err)
}

// claimLatencyP99SQL is the 99th percentile of leased_at - available_at, in
// milliseconds, over queue $1's effects with ids above $2 that were ever
// leased (0 when none).
const claimLatencyP99SQL = `
SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM leased_at - available_at) * 1000), 0)
FROM pgoutbox.effects WHERE queue = $1 AND id > $2 AND leased_at IS NOT NULL`

// ClaimLatencyP99 returns the 99th percentile, in milliseconds, of the time
// queue's effects with ids above afterID waited from due (available_at) to
// their last claim (leased_at), over every such effect that was ever
// leased; 0 when none was. It reads the whole queue: it is for a
// benchmark's own queue.
func ClaimLatencyP99(ctx context.Context, db DBTX, queue string, afterID int64) (float64, error) {
	var ms float64
	err := db.QueryRow(ctx, claimLatencyP99SQL, queue, afterID).Scan(&ms)
	return ms, MapError(err)
}

// purgeQueueSQL deletes a queue's effects, then its idempotency keys (which
// outlive their effects, migration 00007), $2 rows per statement.
var purgeQueueSQL = []string{
	`DELETE FROM pgoutbox.effects WHERE id = ANY(ARRAY(
		SELECT id FROM pgoutbox.effects WHERE queue = $1 LIMIT $2))`,
	`DELETE FROM pgoutbox.effect_keys WHERE ctid = ANY(ARRAY(
		SELECT ctid FROM pgoutbox.effect_keys WHERE queue = $1 LIMIT $2))`,
}

// PurgeQueue deletes every effect and every idempotency key of queue, batch
// rows per statement (each its own transaction on a pool), so no statement
// holds many row locks or a long snapshot. It bypasses the engine's states:
// it is for a benchmark's throw-away queue, never for a live one. batch must
// be positive.
func PurgeQueue(ctx context.Context, db DBTX, queue string, batch int) error {
	if batch <= 0 {
		return errors.New("store: PurgeQueue batch must be positive")
	}
	for _, stmt := range purgeQueueSQL {
		for {
			tag, err := db.Exec(ctx, stmt, queue, batch)
			if err != nil {
				return MapError(err)
			}
			if tag.RowsAffected() == 0 {
				break
			}
		}
	}
	return nil
}
