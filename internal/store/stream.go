package store

// The statements of batch storage (migration 00027, docs/batch-storage.md):
// a queue's storage, the ticks that close batches of pgoutbox.stream by
// snapshot, the fenced batch lease, its pages and its settlement, and the
// generations' rotation.

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Storage values of pgoutbox.queue_storage.
const (
	StorageRows  = "rows"
	StorageBatch = "batch"
)

// setStorageSQL records each queue's storage and, where $3's is above 0,
// its lanes (0: the recorded count, 1 for a new queue).
const setStorageSQL = `
WITH input AS (SELECT * FROM unnest($1::text[], $2::text[], $3::int[]) AS t(queue, storage, lanes))
INSERT INTO pgoutbox.queue_storage AS s (queue, storage, lanes)
SELECT i.queue, i.storage, greatest(i.lanes, 1) FROM input i
ON CONFLICT (queue) DO UPDATE
SET storage = excluded.storage, chosen_at = now(),
    lanes = coalesce((SELECT i.lanes FROM input i WHERE i.queue = excluded.queue AND i.lanes > 0), s.lanes)
WHERE s.storage IS DISTINCT FROM excluded.storage
   OR s.lanes <> coalesce((SELECT i.lanes FROM input i WHERE i.queue = excluded.queue AND i.lanes > 0), s.lanes)`

// SetStorage records each queue's storage (StorageRows or StorageBatch)
// and its lanes (lanes[i] 0, or lanes nil: the recorded count, 1 for a
// queue not recorded yet); rows already right are not written.
func SetStorage(ctx context.Context, db DBTX, queues, storages []string, lanes []int32) error {
	if lanes == nil {
		lanes = make([]int32, len(queues))
	}
	_, err := db.Exec(ctx, setStorageSQL, queues, storages, lanes)
	return MapError(err)
}

// queueStreamsSQL: for each queue of $1, whether its recorded storage is
// batch, and whether pgoutbox.stream holds any of its effects (a probe of
// stream_xid_idx).
const queueStreamsSQL = `
SELECT q,
    EXISTS (SELECT 1 FROM pgoutbox.queue_storage s WHERE s.queue = q AND s.storage = 'batch'),
    EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.queue = q)
FROM unnest($1::text[]) AS q`

// QueueStream is what a Client's batch loop of a queue needs to know.
type QueueStream struct {
	// Batch is set when the queue's recorded storage is batch.
	Batch bool
	// Stream is set when pgoutbox.stream holds effects of the queue, to
	// deliver or settled and not yet rotated out: a queue switched from
	// batch storage back to rows is delivered from its stream until it
	// holds none.
	Stream bool
}

// QueueStreams returns, for each of queues, its QueueStream.
func QueueStreams(ctx context.Context, db DBTX, queues []string) (map[string]QueueStream, error) {
	rows, err := db.Query(ctx, queueStreamsSQL, queues)
	if err != nil {
		return nil, MapError(err)
	}
	out := map[string]QueueStream{}
	var q string
	var qs QueueStream
	_, err = pgx.ForEachRow(rows, []any{&q, &qs.Batch, &qs.Stream}, func() error {
		out[q] = qs
		return nil
	})
	return out, MapError(err)
}

// Batch is a leased batch of a queue's stream.
type Batch struct {
	Queue       string
	ID          int64
	Snap        string // pg_snapshot, text form
	PrevSnap    *string
	MinID       int64
	MaxID       int64
	Effects     int64
	DoneThrough int64
	Token       uuid.UUID
	// SlotLo and SlotHi are the batch's lane: the stream rows whose slot
	// is between them (migration 00031).
	SlotLo, SlotHi int16
	// Relet is set when the batch was leased before and its lease expired
	// unsettled: its holder may have died delivering it, so its effects
	// may have been delivered, and one of them may kill its consumer.
	Relet bool
}

const tickSQL = `SELECT pgoutbox.stream_tick($1)`

// Tick closes the queue's next batch when rows were committed since the
// last one, and reports whether it did.
func Tick(ctx context.Context, db DBTX, queue string) (bool, error) {
	var id *int64
	if err := db.QueryRow(ctx, tickSQL, queue).Scan(&id); err != nil {
		return false, MapError(err)
	}
	return id != nil, nil
}

// claimBatchSQL leases the queue's oldest open batch that no other
// consumer holds under a lease that has not expired and that no older open
// batch overlaps in slots (pgoutbox.stream_next_batch, migration 00031),
// unless the queue is paused: a lane's batches are delivered one at a
// time, in tick order, so the effects of one ordering key are delivered in
// commit order. A re-lease draws a new token, which fences the former
// holder out. $1 queue, $2 owner, $3 lease seconds.
const claimBatchSQL = `
WITH head AS (
    SELECT b.id, b.lease_token IS NOT NULL AS relet FROM pgoutbox.stream_next_batch($1) b
    WHERE ` + notPausedSQL + `
)
UPDATE pgoutbox.stream_batches b
SET lease_token = gen_random_uuid(), lease_owner = $2, lease_expires_at = now() + make_interval(secs => $3)
FROM head
WHERE b.queue = $1 AND b.id = head.id AND b.done_at IS NULL
  AND (b.lease_token IS NULL OR b.lease_expires_at < now())
RETURNING b.id, b.snap::text, b.prev_snap::text, b.min_id, b.max_id, b.effects, b.done_through, b.lease_token,
    head.relet, b.slot_lo, b.slot_hi`

// ClaimBatch leases the queue's oldest open batch; ok is false when there
// is none to take.
func ClaimBatch(ctx context.Context, db DBTX, queue, owner string, lease time.Duration) (b Batch, ok bool, err error) {
	b.Queue = queue
	err = db.QueryRow(ctx, claimBatchSQL, queue, owner, lease.Seconds()).Scan(&b.ID, &b.Snap, &b.PrevSnap, &b.MinID,
		&b.MaxID, &b.Effects, &b.DoneThrough, &b.Token, &b.Relet, &b.SlotLo, &b.SlotHi)
	if errors.Is(err, pgx.ErrNoRows) {
		return Batch{}, false, nil
	}
	if err != nil {
		return Batch{}, false, MapError(err)
	}
	return b, true, nil
}

const extendBatchSQL = `
UPDATE pgoutbox.stream_batches SET lease_expires_at = now() + make_interval(secs => $4)
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL`

// ExtendBatch extends b's lease; false: the lease was lost.
func ExtendBatch(ctx context.Context, db DBTX, b Batch, lease time.Duration) (bool, error) {
	tag, err := db.Exec(ctx, extendBatchSQL, b.Queue, b.ID, pgUUID(b.Token), lease.Seconds())
	if err != nil {
		return false, MapError(err)
	}
	return tag.RowsAffected() == 1, nil
}

const releaseBatchSQL = `
UPDATE pgoutbox.stream_batches SET lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL`

// ReleaseBatch gives b's lease up (a consumer stopping between pages): the
// next claim takes the batch at once, and not as Relet.
func ReleaseBatch(ctx context.Context, db DBTX, b Batch) error {
	_, err := db.Exec(ctx, releaseBatchSQL, b.Queue, b.ID, pgUUID(b.Token))
	return MapError(err)
}

// pageSQL reads the next page of a batch (pgoutbox.stream_page, migrations
// 00028, 00031): its lane's rows after the settled position, in id order,
// through the id index between the batch's first and last ids, keeping
// those committed in its snapshot and not in the previous one. $1 queue,
// $2 after, $3 max id, $4 snap, $5 previous snap, $6 limit, $7 and $8 the
// lane's slots.
const pageSQL = `
SELECT s.id, s.effect_type, s.idempotency_key, s.payload, s.max_attempts, s.created_at,
    extract(epoch FROM now() - s.available_at)::float8, coalesce(s.ordering_key, ''), coalesce(s.traceparent, '')
FROM pgoutbox.stream_page($1, $2, $3, $4::pg_snapshot, $5::pg_snapshot, $6, $7::smallint, $8::smallint) s`

// pagePrealloc bounds the room Page makes for a page before reading it: a
// page of the default size (1,000) is read without growing its slice, and a
// large PageSize costs memory only for the effects it holds.
const pagePrealloc = 1024

// Page reads up to limit effects of b after id after, in id order, as
// first attempts (Claimed.Token is b's token, Claimed.Queue b's queue;
// ClaimLatency is negative for an effect not yet due).
func Page(ctx context.Context, db DBTX, b Batch, after int64, limit int) ([]Claimed, error) {
	rows, err := db.Query(ctx, pageSQL, b.Queue, after, b.MaxID, b.Snap, b.PrevSnap, limit, b.SlotLo, b.SlotHi)
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	out := make([]Claimed, 0, min(limit, pagePrealloc))
	for rows.Next() {
		c := Claimed{Queue: b.Queue, Attempt: 1, Token: b.Token}
		var lat float64
		if err := rows.Scan(&c.ID, &c.Type, &c.Key, &c.Payload, &c.MaxAttempts, &c.CreatedAt, &lat,
			&c.OrderingKey, &c.Traceparent); err != nil {
			return nil, err
		}
		c.ClaimLatency = time.Duration(lat * float64(time.Second))
		out = append(out, c)
	}
	return out, MapError(rows.Err())
}

// heldKeysSQL returns which of the ordering keys $2 of queue $1 have an
// effect in pgoutbox.effects that holds back later ones (blocksSQL): a
// stream effect of such a key is moved behind it, not delivered.
const heldKeysSQL = `
SELECT k FROM unnest($2::text[]) AS k
WHERE EXISTS (
    SELECT 1 FROM pgoutbox.effects p
    WHERE p.queue = $1 AND p.ordering_key = k AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
      AND ` + blocksSQL + `)`

// HeldKeys returns the keys of keys that an effect in pgoutbox.effects
// holds back in queue.
func HeldKeys(ctx context.Context, db DBTX, queue string, keys []string) (map[string]bool, error) {
	out := map[string]bool{}
	if len(keys) == 0 {
		return out, nil
	}
	rows, err := db.Query(ctx, heldKeysSQL, queue, keys)
	if err != nil {
		return nil, MapError(err)
	}
	var k string
	_, err = pgx.ForEachRow(rows, []any{&k}, func() error {
		out[k] = true
		return nil
	})
	return out, MapError(err)
}

// Move is a stream effect that leaves the stream for pgoutbox.effects when
// its page is settled: an exception.
type Move struct {
	Effect Claimed
	// State is "available" (a retry after Delay, or an effect not run from
	// the batch, Attempts 0), "dead_letter", or "leased" (a delivery still
	// running when its page settled, promoted to a durable lease: Token,
	// for Lease, owned by Settle's worker).
	State    string
	Attempts int
	Delay    time.Duration
	Error    string
	Token    uuid.UUID
	Lease    time.Duration
}

// settleFenceSQL advances b's settled position, fenced by its token; $5
// marks it done. $1 queue, $2 batch id, $3 token, $4 position.
const settleFenceSQL = `
UPDATE pgoutbox.stream_batches
SET done_through = $4, done_at = CASE WHEN $5 THEN now() END,
    lease_token = CASE WHEN $5 THEN NULL ELSE lease_token END,
    lease_expires_at = CASE WHEN $5 THEN NULL ELSE lease_expires_at END,
    type_passed = pgoutbox.stream_passed(type_names, type_passed, $6::text[], $7::bigint[])
WHERE queue = $1 AND id = $2 AND lease_token = $3 AND done_at IS NULL`

// moveSQL writes the exceptions of a page into pgoutbox.effects under
// their stream ids; their key rows exist already (the enqueue wrote them),
// which the insert trigger is told, and effects_to_stream that they stay. The failed attempts are recorded as
// the effects table's trigger records a failed attempt's update.
const moveSQL = `
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
WHERE i.attempts > 0 AND i.state <> 'leased'`

// Completion is a delivered effect of a page whose handler registered
// OnComplete transitions: they run in the page's settling transaction,
// each effect's in a savepoint.
type Completion struct {
	Effect Claimed
	Fns    []func(context.Context, pgx.Tx) error
}

// PageCompleted counts a page's effects of one type delivered from the batch
// (no row of their own), for status (pgoutbox.stream_settled, migration
// 00028): how many, and the median and 99th percentile of their lag
// (creation to the end of delivery) in seconds.
type PageCompleted struct {
	Type           string
	Count          int64
	LagP50, LagP99 float64
}

// PageSettle is what a page's settle writes: the settled position Through
// (Last: the batch is done), the exceptions, the completions whose
// OnComplete transitions run in the settle, the page's counts of effects
// completed from the batch, per type, and the page's effects per type
// (Passed, PassedTypes), which the batch's type_passed counts for `status`.
type PageSettle struct {
	Through   int64
	Last      bool
	Moves     []Move
	Done      []Completion
	Completed []PageCompleted
	// Passed is every effect of the page (the batch's effects with ids
	// past its settled position, through Through) per type: completed,
	// moved to pgoutbox.effects or neither.
	Passed map[string]int64
}

// PassedTypes counts page's effects per type, for PageSettle.Passed.
func PassedTypes(page []Claimed) map[string]int64 {
	m := make(map[string]int64, 4)
	for _, c := range page {
		m[c.Type]++
	}
	return m
}

const settledSQL = `
INSERT INTO pgoutbox.stream_settled (queue, effect_type, completed, lag_p50, lag_p99)
SELECT $1, t.* FROM unnest($2::text[], $3::bigint[], $4::float8[], $5::float8[]) AS t`

// Settle records a page of b in one transaction fenced by b's token: the
// completions' transitions run first, each effect's in a savepoint (one
// that fails is rolled back and becomes the Move failed returns); then the
// exceptions go to pgoutbox.effects, the page's counts to
// pgoutbox.stream_settled, and the settled position becomes p.Through.
// found is false, and nothing is written, when the lease was lost.
func Settle(ctx context.Context, pool *pgxpool.Pool, b Batch, worker string, p PageSettle,
	failed func(Claimed, error) Move) (found bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		passedTypes, passed := make([]string, 0, len(p.Passed)), make([]int64, 0, len(p.Passed))
		for t, n := range p.Passed {
			passedTypes, passed = append(passedTypes, t), append(passed, n)
		}
		tag, err := tx.Exec(ctx, settleFenceSQL, b.Queue, b.ID, pgUUID(b.Token), p.Through, p.Last, passedTypes,
			passed)
		if err != nil {
			return err
		}
		if found = tag.RowsAffected() == 1; !found {
			return nil
		}
		all := p.Moves
		for _, c := range p.Done {
			err := pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				for _, fn := range c.Fns {
					if err := fn(ctx, sp); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				all = append(all[:len(all):len(all)], failed(c.Effect, err))
			}
		}
		if len(p.Completed) > 0 {
			// An effect whose transitions failed is a retry, not a completion.
			unfinished := map[string]int64{}
			for _, m := range all[len(p.Moves):] {
				unfinished[m.Effect.Type]++
			}
			var types []string
			var counts []int64
			var p50, p99 []float64
			for _, c := range p.Completed {
				if n := c.Count - unfinished[c.Type]; n > 0 {
					types, counts = append(types, c.Type), append(counts, n)
					p50, p99 = append(p50, c.LagP50), append(p99, c.LagP99)
				}
			}
			if _, err := tx.Exec(ctx, settledSQL, b.Queue, types, counts, p50, p99); err != nil {
				return err
			}
		}
		if len(all) == 0 {
			return nil
		}
		ids, states := make([]int64, len(all)), make([]string, len(all))
		attempts, delays, errs := make([]int32, len(all)), make([]float64, len(all)), make([]string, len(all))
		tokens, leases := make([]*pgtype.UUID, len(all)), make([]float64, len(all))
		for i, m := range all {
			ids[i], states[i], attempts[i] = m.Effect.ID, m.State, int32(m.Attempts)
			delays[i], errs[i], leases[i] = m.Delay.Seconds(), m.Error, m.Lease.Seconds()
			if m.Token != (uuid.UUID{}) {
				u := pgUUID(m.Token)
				tokens[i] = &u
			}
		}
		_, err = tx.Exec(ctx, moveSQL, ids, states, attempts, delays, errs, worker, b.Queue, tokens, leases)
		return err
	})
	if err != nil {
		return false, MapError(err)
	}
	return found, nil
}

const pruneSettledSQL = `
DELETE FROM pgoutbox.stream_settled WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM pgoutbox.stream_settled WHERE settled_at < now() - make_interval(secs => $1) LIMIT $2))`

// PruneSettled deletes up to limit of batch storage's completion counts
// (pgoutbox.stream_settled) older than retention and returns how many.
func PruneSettled(ctx context.Context, db DBTX, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneSettledSQL, retention.Seconds(), limit)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

const clearLeftBatchSQL = `SELECT pgoutbox.clear_left_batch()`

// ClearLeftBatch clears queue_storage.left_batch_at of the queues switched
// from batch storage back to rows whose stream holds none of their
// effects unsettled, once no ordering lock is held (pgoutbox.clear_left_batch,
// migration 00034), so that their claims stop reading the stream's floor;
// it returns how many it cleared. db must not be in a transaction of
// another isolation than READ COMMITTED.
func ClearLeftBatch(ctx context.Context, db DBTX) (int, error) {
	var n int
	err := db.QueryRow(ctx, clearLeftBatchSQL).Scan(&n)
	return n, MapError(err)
}

const streamMaintainSQL = `SELECT pgoutbox.stream_maintain(make_interval(secs => $1), make_interval(secs => $2))`

// StreamMaintain empties the closed generations whose batches are settled
// and that were closed for retention, closes the current one when it is
// older than rotateAfter (pgoutbox.stream_maintain), and returns how many
// generations it emptied.
func StreamMaintain(ctx context.Context, db DBTX, rotateAfter, retention time.Duration) (int, error) {
	var n int
	err := db.QueryRow(ctx, streamMaintainSQL, rotateAfter.Seconds(), retention.Seconds()).Scan(&n)
	return n, MapError(err)
}
