// Package store holds every SQL statement of the pgoutbox engine: enqueue,
// claim, complete, fail, extend, sweep, prune and replay. Nothing else in the
// engine writes SQL against pgoutbox.effects.
//
// Every state change out of `leased` is fenced: it matches the effect id, the
// lease token and the expected effect type, and it requires the row to still
// be `leased`. A statement that matches no row means the caller's lease was
// lost (recovered by a sweeper, re-claimed by another worker); callers map
// that to pgoutbox.ErrLeaseLost. Driver errors are mapped once, here, by
// [MapError].
//
// All time arithmetic uses the database clock (now()); callers pass durations
// in seconds, never absolute timestamps computed on the worker. The one
// exception is NewEffect.AvailableAt, a caller's explicit absolute schedule
// (pgoutbox.Effect.AvailableAt), stored as given; a relative schedule is
// NewEffect.Delay, applied to the database's now().
//
// A statement that finds rows by id and also checks their state compares
// state::text, never state: the planner cannot then match the condition to
// a partial index on that state (effects_lease_expiry_idx, effects_claim_idx,
// …) and always probes the primary key. Otherwise, once autovacuum has
// analyzed the table while few rows were leased, a fenced completion of
// 1,000 effects scans the whole lease index once per effect: 1 s instead of
// 7 ms (EXPLAIN ANALYZE with 5,000 leased rows), and a drain collapses to a
// tenth of its rate.
package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// DBTX is what every function here runs on: a pool, a connection or a
// transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// NotifyChannel is the LISTEN/NOTIFY channel; the payload is the queue name.
// The insert trigger of migration 00001 notifies it.
const NotifyChannel = "pgoutbox_effects"

// ListenSQL subscribes a connection to NotifyChannel.
const ListenSQL = "LISTEN " + NotifyChannel

// Violation is a constraint failure reported by the database, mapped once.
type Violation struct {
	Constraint string
	Err        error
}

func (v *Violation) Error() string {
	return fmt.Sprintf("store: constraint %s violated", v.Constraint)
}

func (v *Violation) Unwrap() error { return v.Err }

// MapError turns a driver error into a *Violation for check and unique
// violations (so callers can type-switch on the constraint name) and leaves
// every other error as it is.
func MapError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "23514" || pgErr.Code == "23505" || pgErr.Code == "23502") {
		return &Violation{Constraint: pgErr.ConstraintName, Err: err}
	}
	return err
}

// NewEffect is one row to insert.
type NewEffect struct {
	Queue       string
	Type        string
	Key         string
	Payload     []byte
	MaxAttempts int
	// AvailableAt, when set, is the caller's absolute schedule, stored as
	// given (the one instant the store takes from outside the database).
	// Nil means now() + Delay, on the database clock.
	AvailableAt *time.Time
	// Delay is added to the database's now() when AvailableAt is nil.
	Delay time.Duration
	// OrderingKey, when not empty, puts the effect in its queue's ordered
	// sequence of that key (migration 00013): it is claimed only once every
	// earlier effect of the queue and key is terminal (see claimableSQL).
	OrderingKey string
	// Traceparent, when not empty, is the W3C traceparent of the enqueue's
	// span (migration 00024), which the delivery continues. Empty writes
	// NULL.
	Traceparent string
}

// insertSQL writes the key rows first (migration 00006): ON CONFLICT DO
// NOTHING skips a key already present, waiting for a concurrent transaction
// that inserted it, and only the effects whose key row was written are
// inserted. Ids come from the effects' identity sequence, in input order.
//
// Key rows are inserted in one canonical order, (queue, key) under the "C"
// collation, whatever the input order: two batches sharing keys then wait
// for each other on their first shared key instead of each holding one the
// other needs (a deadlock, when they came in different orders). The id
// breaks ties, so a key repeated in a batch goes to its first occurrence.
//
// Under REPEATABLE READ or SERIALIZABLE, a key committed by a concurrent
// transaction after this transaction's snapshot cannot be returned (the
// snapshot cannot see it): PostgreSQL raises serialization_failure (40001)
// and the caller retries the transaction, which then returns the existing
// effect.
const insertSQL = `
WITH input AS (
    SELECT nextval('pgoutbox.effects_id_seq'::regclass) AS id, t.*
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[], $7::float8[], $8::text[], $9::text[])
        WITH ORDINALITY AS t(queue, effect_type, idempotency_key, payload, max_attempts, available_at, delay_s, ordering_key,
                             traceparent, ord)
    ORDER BY t.ord
)` + insertTailSQL

// insertStagedSQL is insertSQL reading its input from the staging table
// that InsertCopy filled by COPY (stageTableSQL) instead of from arrays:
// the same key rows in the same canonical order, the same ids in input
// order, the same insert.
const insertStagedSQL = `
WITH input AS (
    SELECT nextval('pgoutbox.effects_id_seq'::regclass) AS id, t.*
    FROM pg_temp.` + stageTable + ` AS t
    ORDER BY t.ord
)` + insertTailSQL

// insertTailSQL is what insertSQL and insertStagedSQL share: everything
// after the input. The effects of a queue whose storage is batch
// (migration 00027) go to pgoutbox.stream, in the generation stream_gen
// names (asked only when there is one); the others to pgoutbox.effects.
// Payloads arrive as text: the stream keeps them as json, the text as
// given (migration 00036), pgoutbox.effects as jsonb.
const insertTailSQL = `, keyed AS (
    INSERT INTO pgoutbox.effect_keys (queue, idempotency_key, effect_id)
    SELECT queue, idempotency_key, id FROM input ORDER BY queue COLLATE "C", idempotency_key COLLATE "C", id
    ON CONFLICT (queue, idempotency_key) DO NOTHING
    RETURNING effect_id
), marked AS (
    -- Tells the insert trigger (migration 00006) that this statement wrote
    -- its key rows, and effects_to_stream's WHEN (00027) that it routed
    -- its rows itself; the insert trigger resets both.
    SELECT set_config('pgoutbox.keys_written', 'on', true) AS m, set_config('pgoutbox.routed', 'on', true) AS r
), batched AS (
    SELECT s.queue FROM pgoutbox.queue_storage s
    WHERE s.storage = 'batch' AND s.queue IN (SELECT DISTINCT queue FROM input)
), streamed AS (
    INSERT INTO pgoutbox.stream (gen, id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
        ordering_key, traceparent)
    SELECT (SELECT pgoutbox.stream_gen()), i.id, i.queue, i.effect_type, i.idempotency_key, i.payload::json, i.max_attempts,
        coalesce(i.available_at, now() + make_interval(secs => i.delay_s)), nullif(i.ordering_key, ''), i.traceparent
    FROM input i JOIN keyed k ON k.effect_id = i.id
    WHERE i.queue IN (SELECT queue FROM batched)
    ORDER BY i.id
), rowed AS (
    INSERT INTO pgoutbox.effects (id, queue, effect_type, idempotency_key, payload, max_attempts, available_at,
        ordering_key, traceparent)
    OVERRIDING SYSTEM VALUE
    SELECT i.id, i.queue, i.effect_type, i.idempotency_key, i.payload::jsonb, i.max_attempts,
        coalesce(i.available_at, now() + make_interval(secs => i.delay_s)), nullif(i.ordering_key, ''), i.traceparent
    FROM input i JOIN keyed k ON k.effect_id = i.id CROSS JOIN marked
    WHERE i.queue NOT IN (SELECT queue FROM batched)
    ORDER BY i.id
)
SELECT i.id, i.queue, i.idempotency_key FROM input i JOIN keyed k ON k.effect_id = i.id ORDER BY i.id`

// orderingLockSQL takes the ordering locks of a batch (pgoutbox.ordering_lock,
// migration 00017): a row lock on each distinct stripe of its (queue,
// ordering key) pairs (1,024 rows of pgoutbox.ordering_stripes, which only
// the engine's owner may lock), in stripe order, held until the
// transaction ends. Insert runs it before the
// insert statement draws any id, so a transaction enqueuing to a key waits
// until every other transaction that enqueued to it has ended: the ids of
// one key's effects are in the commit order of their transactions. $1
// queues, $2 ordering keys (NULL: none).
const orderingLockSQL = `SELECT pgoutbox.ordering_lock($1::text[], $2::text[])`

// Inserted is the outcome of one NewEffect.
type Inserted struct {
	ID      int64
	Created bool // false: the key already existed in the queue and nothing was written
}

// Insert writes effects in one statement; a key already present in its queue
// (including earlier in the same batch) returns the existing id and writes
// nothing. Results are in input order.
func Insert(ctx context.Context, db DBTX, effects []NewEffect) ([]Inserted, error) {
	return insert(ctx, db, effects, nil)
}

// stageTable is the temporary table InsertCopy stages a batch in: created
// in the caller's transaction, dropped before InsertCopy returns (and ON
// COMMIT DROP, should the transaction end first), so no session state
// outlives the call, which a transaction-pooling PgBouncer requires.
const stageTable = "pgoutbox_enqueue_stage"

// mayStageSQL reports whether the current role may create the staging
// table (the TEMPORARY privilege on the database).
const mayStageSQL = `SELECT has_database_privilege(current_database(), 'TEMPORARY')`

// stageTableSQL creates stageTable with insertSQL's input columns; ord is
// the position in the batch.
const stageTableSQL = `CREATE TEMPORARY TABLE ` + stageTable + ` (
    queue text, effect_type text, idempotency_key text, payload text, max_attempts int4, available_at timestamptz,
    delay_s float8, ordering_key text, traceparent text, ord int8
) ON COMMIT DROP`

// stageColumns are stageTable's columns in stageTableSQL's order, the
// order InsertCopy's rows give them.
var stageColumns = []string{"queue", "effect_type", "idempotency_key", "payload", "max_attempts", "available_at",
	"delay_s", "ordering_key", "traceparent", "ord"}

// InsertCopy is Insert for large batches: the same ordering locks, key rows,
// ids and results, but the batch reaches the server by COPY into a
// temporary table in tx (stageTable) and one insert-select
// (insertStagedSQL) reads it from there, instead of as nine parameter
// arrays that the server unnests. The temporary table needs the
// TEMPORARY privilege on the database (PostgreSQL grants it to PUBLIC):
// without it, InsertCopy sends arrays as Insert does. Like every temporary
// object, it makes tx unable to PREPARE TRANSACTION.
func InsertCopy(ctx context.Context, tx pgx.Tx, effects []NewEffect) ([]Inserted, error) {
	return insert(ctx, tx, effects, tx)
}

// insert is Insert, or InsertCopy when tx is not nil (tx is then db).
func insert(ctx context.Context, db DBTX, effects []NewEffect, tx pgx.Tx) ([]Inserted, error) {
	n := len(effects)
	queues, types, keys := make([]string, n), make([]string, n), make([]string, n)
	payloads, maxAttempts := make([]string, n), make([]int32, n)
	avail, delays := make([]*time.Time, n), make([]float64, n)
	orderingKeys, ordered := make([]*string, n), false
	// traceparents stays nil (SQL NULL) when no effect has one: unnest
	// pads it with NULLs, and an untraced batch sends no array.
	var traceparents []*string
	for i, e := range effects {
		queues[i], types[i], keys[i] = e.Queue, e.Type, e.Key
		payloads[i], maxAttempts[i], avail[i] = string(e.Payload), int32(e.MaxAttempts), e.AvailableAt
		delays[i] = e.Delay.Seconds()
		if e.OrderingKey != "" {
			orderingKeys[i], ordered = &e.OrderingKey, true
		}
		if e.Traceparent != "" {
			if traceparents == nil {
				traceparents = make([]*string, n)
			}
			traceparents[i] = &e.Traceparent
		}
	}
	if tx != nil {
		// Where the TEMPORARY privilege was revoked, a CREATE TEMPORARY
		// TABLE would abort the caller's transaction: send arrays instead.
		var mayStage bool
		if err := tx.QueryRow(ctx, mayStageSQL).Scan(&mayStage); err != nil {
			return nil, MapError(err)
		}
		if !mayStage {
			db, tx = tx, nil
		}
	}
	if ordered {
		if _, err := db.Exec(ctx, orderingLockSQL, queues, orderingKeys); err != nil {
			return nil, MapError(err)
		}
	}
	type qk struct{ queue, key string }
	created := make(map[qk]int64, n)
	var rows pgx.Rows
	var err error
	if tx == nil {
		rows, err = db.Query(ctx, insertSQL, queues, types, keys, payloads, maxAttempts, avail, delays, orderingKeys, traceparents)
	} else {
		rows, err = stage(ctx, tx, effects)
	}
	if err != nil {
		return nil, MapError(err)
	}
	var id int64
	var k qk
	_, err = pgx.ForEachRow(rows, []any{&id, &k.queue, &k.key}, func() error {
		created[k] = id
		return nil
	})
	if err != nil {
		return nil, MapError(err)
	}
	if tx != nil {
		if _, err := tx.Exec(ctx, `DROP TABLE pg_temp.`+stageTable); err != nil {
			return nil, MapError(err)
		}
	}
	out := make([]Inserted, n)
	var missQ, missK []string
	for i := range out {
		k := qk{queues[i], keys[i]}
		if id, ok := created[k]; ok {
			out[i] = Inserted{ID: id, Created: true}
			delete(created, k) // a repeat of the key later in the batch created nothing
			continue
		}
		missQ, missK = append(missQ, k.queue), append(missK, k.key)
	}
	if len(missQ) == 0 {
		return out, nil
	}
	// Keys that existed already, or repeated in the batch: a fresh
	// statement also sees a row a concurrent transaction committed after
	// the insert's snapshot (ON CONFLICT waited for it).
	existing := make(map[qk]int64, len(missQ))
	rows, err = db.Query(ctx, lookupSQL, missQ, missK)
	if err != nil {
		return nil, MapError(err)
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &k.queue, &k.key}, func() error {
		existing[k] = id
		return nil
	})
	if err != nil {
		return nil, MapError(err)
	}
	for i := range out {
		if out[i].ID != 0 {
			continue
		}
		k := qk{queues[i], keys[i]}
		id, ok := existing[k]
		if !ok {
			return nil, fmt.Errorf("store: effect %q in queue %q conflicts with a row this transaction cannot see", k.key, k.queue)
		}
		out[i].ID = id
	}
	return out, nil
}

// stage creates stageTable in tx, copies effects into it and starts
// insertStagedSQL.
func stage(ctx context.Context, tx pgx.Tx, effects []NewEffect) (pgx.Rows, error) {
	if _, err := tx.Exec(ctx, stageTableSQL); err != nil {
		return nil, err
	}
	i := -1
	var row [10]any
	src := pgx.CopyFromFunc(func() ([]any, error) {
		i++
		if i == len(effects) {
			return nil, nil
		}
		e := &effects[i]
		row = [10]any{e.Queue, e.Type, e.Key, e.Payload, int32(e.MaxAttempts), e.AvailableAt, e.Delay.Seconds(),
			nullIfEmpty(e.OrderingKey), nullIfEmpty(e.Traceparent), int64(i + 1)}
		return row[:], nil
	})
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"pg_temp", stageTable}, stageColumns, src); err != nil {
		return nil, err
	}
	return tx.Query(ctx, insertStagedSQL)
}

// nullIfEmpty is s, or nil (NULL) when s is empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// lookupSQL finds the effects of existing keys: one primary-key probe per
// key (LATERAL), whatever the table's statistics say.
const lookupSQL = `
SELECT k.effect_id, t.queue, t.idempotency_key
FROM unnest($1::text[], $2::text[]) AS t(queue, idempotency_key)
CROSS JOIN LATERAL (
    SELECT x.effect_id FROM pgoutbox.effect_keys x
    WHERE x.queue = t.queue AND x.idempotency_key = t.idempotency_key
    LIMIT 1
) k`

// Claimed is a leased effect handed to a worker.
type Claimed struct {
	ID                int64
	Queue             string
	Type              string
	Key               string
	Payload           []byte
	Attempt           int
	MaxAttempts       int
	Token             uuid.UUID
	CreatedAt         time.Time
	ClaimLatency      time.Duration // now() at claim minus available_at
	DeliveryStartedAt *time.Time
	// OrderingKey is the effect's ordering key ("" for none).
	OrderingKey string
	// Traceparent is the W3C traceparent the enqueue stored ("" for none,
	// migration 00024).
	Traceparent string
	// Suspect is set by LockClaim only: the effect was attempted before, or
	// its row still carries the lock of an earlier claimer that never wrote
	// it (a row-lock holder whose worker died during the hold). It must not
	// be delivered under a row lock, which would count no attempt.
	Suspect bool
}

// claimableSQL picks the head of a queue's available effects, locking them
// and skipping rows another claimer holds. $1 queue, $2 limit.
//
// An effect with an ordering key is claimable only at the head of its key
// (headOfLineSQL), behind the unsettled effects of its queue's stream when
// the queue left batch storage (notBehindStreamSQL), while no later effect
// of its key is leased (notOvertakenSQL) and while no batch page that may
// deliver one is in flight (notBehindBatchSQL), and only while the queue
// is not paused (notPausedSQL).
// The ordering checks are a filter on the rows the claim index
// yields, evaluated only for rows whose ordering_key is set: a queue
// without ordered effects keeps the plan it had before migration 00013.
const claimableSQL = `
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND ` + notPausedSQL + `
      AND (e.ordering_key IS NULL OR (` + notBehindStreamSQL + ` AND ` + headOfLineSQL + ` AND ` + notOvertakenSQL + ` AND ` + notBehindBatchSQL + `))
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED`

// blocksSQL is true when the effect p holds back the later effects of its
// queue and ordering key: it is not terminal for ordering. available
// (due, retrying or scheduled), leased and reconciliation_required always
// block; completed never; dead_letter blocks unless p's type lets its key
// move on (orderingMovesOnSQL).
const blocksSQL = `(p.state <> 'dead_letter' OR NOT ` + orderingMovesOnSQL + `)`

// orderingMovesOnSQL is the ordering choice of p's queue and type (migration
// 00018, written from EffectType.OrderingMovesOn): does its dead letter let
// its key move on? The (queue, type) row of pgoutbox.ordering_choices, else
// the type's row of pgoutbox.ordering_types (written by Clients before
// 00018), else false (strict). Each is one primary-key probe.
const orderingMovesOnSQL = `coalesce(
        (SELECT c.dead_letter_moves_on FROM pgoutbox.ordering_choices c
         WHERE c.queue = p.queue AND c.effect_type = p.effect_type),
        (SELECT t.dead_letter_moves_on FROM pgoutbox.ordering_types t
         WHERE t.effect_type = p.effect_type),
        false)`

// stuckSQL is true when the effect p blocks the later effects of its key
// (blocksSQL) until an operator acts: a strict dead letter (replay it) or a
// reconciliation record (resolve it). BlockedKey.Stuck is its Go twin.
const stuckSQL = `(p.state IN ('dead_letter', 'reconciliation_required') AND ` + blocksSQL + `)`

// blockingEarlierSQL is true when p is an earlier effect (lower id) of e's
// queue and ordering key that blocks it (blocksSQL); its range is that of
// effects_ordering_idx, which holds only the ordered effects that are not
// completed. Ids of one key are in commit order (orderingLockSQL), so
// "earlier" is "committed earlier".
const blockingEarlierSQL = `p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id < e.id
          AND p.ordering_key IS NOT NULL AND p.state <> 'completed'
          AND ` + blocksSQL

// headOfLineSQL is true when no earlier effect of e's queue and ordering
// key blocks it: one probe of effects_ordering_idx.
const headOfLineSQL = `NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE ` + blockingEarlierSQL + `)`

// notOvertakenSQL is true when no later effect (higher id) of e's queue and
// ordering key is leased: one probe of effects_ordered_leases_idx
// (migration 00016), which holds only the leased ordered effects. A later
// effect is in delivery while e waits only when e is a move-on dead letter
// that was replayed after the key moved on: e is then delivered after that
// delivery, never beside it. (A later effect delivered under a row lock is
// not leased; the replay waits for its claim transaction instead, see
// ReplayDeadLetters.)
const notOvertakenSQL = `NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects p
        WHERE p.queue = e.queue AND p.ordering_key = e.ordering_key AND p.id > e.id
          AND p.ordering_key IS NOT NULL AND p.state = 'leased')`

// notBehindBatchSQL is true unless e is a replayed move-on dead letter of a
// batch queue whose replay found the queue's batch leased with a page in
// flight, and that page is still in flight: the same batch, lease token
// and settled position, the lease not expired (migration 00029). Such a
// page may be delivering a later effect of e's key from the batch, which
// has no row in pgoutbox.effects until the page settles, so
// notOvertakenSQL cannot see it. Once the page settles (a delivered
// effect writes nothing; one still running is a leased row then, which
// notOvertakenSQL sees), the batch's lease is released or taken over, or
// it expires, e is claimable. One probe of pgoutbox.replay_barriers'
// primary key, a table that holds a row only between such a replay and
// its page's settle.
const notBehindBatchSQL = `NOT EXISTS (
        SELECT 1 FROM pgoutbox.replay_barriers w
        JOIN pgoutbox.stream_batches b ON b.queue = w.queue AND b.id = w.batch_id
        WHERE w.effect_id = e.id AND b.done_at IS NULL AND b.done_through = w.done_through
          AND b.lease_token = w.lease_token AND b.lease_expires_at >= now())`

// notBehindStreamSQL is true unless e's queue was switched from batch
// storage back to rows and its stream still holds an effect, not yet
// settled, with an id below e's (migration 00034). Such an effect may be
// an earlier one of e's key: the enqueue wrote it to the stream before
// the switch, and e, enqueued after it, to pgoutbox.effects; the batch
// loop delivers the stream's effects (or moves them into rows) while the
// row claim runs beside it, so e waits until the stream's effects below
// it are settled. The stream has no index by ordering key, so the bound
// is the queue's lowest unsettled stream id (pgoutbox.stream_floor), not
// its key's: after a switch back, a queue's ordered effects in rows wait
// for the stream's backlog ahead of them, delivered at batch speed. The
// floor is a subquery of $1 alone, run once per claim (an InitPlan) and
// only when an ordered effect is a candidate: one probe of queue_storage,
// and only for a queue whose storage left batch (left_batch_at, which the
// function does not read again) a call of pgoutbox.stream_floor, NULL when
// its stream holds nothing to deliver. A
// queue whose storage is batch has no floor: its pages move a key's stream
// effects behind the ones pgoutbox.effects holds. The floor is a PL/pgSQL
// function, which keeps its statements' plans for the session: written out
// here, its subqueries cost the claim's planning more than their run.
const notBehindStreamSQL = `e.id < ` + streamFloorHead + `$1` + streamFloorTail

// behindStreamSQL is notBehindStreamSQL's negation for e's own queue, for
// the console's lists (a correlated subquery, one probe per row listed).
const behindStreamSQL = `e.id >= ` + streamFloorHead + `e.queue` + streamFloorTail

// streamFloorHead and streamFloorTail enclose a queue expression: the
// lowest unsettled id of its stream when it left batch storage, else the
// largest bigint.
const (
	streamFloorHead = `coalesce((
        SELECT pgoutbox.stream_floor(qs.queue) FROM pgoutbox.queue_storage qs
        WHERE qs.queue = `
	streamFloorTail = ` AND qs.storage = 'rows' AND qs.left_batch_at IS NOT NULL), 9223372036854775807)`
)

// leaseSQL turns the rows of a CTE "next" into durable leases. $3 owner,
// $4 lease seconds, $5 added to attempts.
//
// The lease runs from the statement's start (statement_timestamp()), not
// the transaction's (now()): a promotion (Promote) runs in a claim
// transaction that has held its row locks for a while, and its durable
// lease must still be a whole lease long. leased_at keeps the claim's time.
const leaseSQL = `
UPDATE pgoutbox.effects e
SET state = 'leased', attempts = e.attempts + $5::int, lease_owner = $3,
    lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = statement_timestamp() + make_interval(secs => $4)
WHERE e.id = ANY(ARRAY(SELECT id FROM next))
RETURNING ` + claimedColumns

// claimedColumns is what every claim returns, in Claimed's scan order.
const claimedColumns = `e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts, e.max_attempts,
    e.lease_token, e.created_at, extract(epoch FROM now() - e.available_at)::float8, e.delivery_started_at,
    coalesce(e.ordering_key, ''), coalesce(e.traceparent, '')`

const claimSQL = `WITH next AS (SELECT id ` + claimableSQL + `)` + leaseSQL

// Claim leases up to limit available effects of a queue, oldest
// (available_at, id) first, skipping rows another claimer holds.
func Claim(ctx context.Context, db DBTX, queue, owner string, limit int, lease time.Duration) ([]Claimed, error) {
	return claim(ctx, db, queue, owner, limit, lease, 1)
}

// claim is Claim, adding countAttempt (1 for a delivery, 0 for a relay's
// publication) to each effect's attempts.
func claim(ctx context.Context, db DBTX, queue, owner string, limit int, lease time.Duration, countAttempt int) ([]Claimed, error) {
	rows, err := db.Query(ctx, claimSQL, queue, limit, owner, lease.Seconds(), countAttempt)
	if err != nil {
		return nil, MapError(err)
	}
	return scanClaimed(rows)
}

func scanClaimed(rows pgx.Rows) ([]Claimed, error) {
	return scanClaimedRows(rows, false)
}

// scanClaimedRows scans claimedColumns, followed by the suspect flag when
// suspect is set (lockClaimSQL).
func scanClaimedRows(rows pgx.Rows, suspect bool) ([]Claimed, error) {
	defer rows.Close()
	var out []Claimed
	for rows.Next() {
		var c Claimed
		var lat float64
		dest := []any{&c.ID, &c.Queue, &c.Type, &c.Key, &c.Payload, &c.Attempt, &c.MaxAttempts,
			&c.Token, &c.CreatedAt, &lat, &c.DeliveryStartedAt, &c.OrderingKey, &c.Traceparent}
		if suspect {
			dest = append(dest, &c.Suspect)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if lat < 0 {
			lat = 0
		}
		c.ClaimLatency = time.Duration(lat * float64(time.Second))
		out = append(out, c)
	}
	return out, MapError(rows.Err())
}

// lockClaimSQL's last column is Claimed.Suspect. A row lock is written into
// the row: SELECT … FOR UPDATE stores the locker's transaction id in the
// tuple's xmax, and it stays there when that transaction ends without
// updating the row. Every claim that locks an available row and commits
// also updates it (a row-lock batch completes or promotes each row it
// locked, a durable claim leases it), so an available row whose xmax is set
// was locked by a claimer that died (or lost its connection) during the
// hold — or, harmlessly, by a statement that locks before it updates (a
// failure or release routed back to available, a sweeper). xmax is read
// as the scan saw the row, before this statement's own lock. Rows that
// were attempted before (attempts > 0) are suspect too, whatever wrote
// them last: a retry takes a durable lease.
const lockClaimSQL = `SELECT e.id, e.queue, e.effect_type, e.idempotency_key, e.payload, e.attempts + 1, e.max_attempts,
    '00000000-0000-0000-0000-000000000000'::uuid, e.created_at, extract(epoch FROM now() - e.available_at)::float8,
    e.delivery_started_at, coalesce(e.ordering_key, ''), coalesce(e.traceparent, ''), (e.xmax <> '0'::xid OR e.attempts > 0)` + claimableSQL

// Batcher sends a batch of statements in one round trip: a connection or
// a transaction.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// LockClaim is the claim of a row-lock lease: inside tx it locks up to limit
// available effects of a queue (oldest first, skipping rows another claimer
// holds) and writes nothing. The lease is the row lock: it lasts as long as
// tx, and the server ends tx if it sits idle for idle (a frozen worker).
// Attempt is the attempt a delivery would be; Token is zero. Suspect rows
// (see lockClaimSQL) must be promoted before they are delivered.
func LockClaim(ctx context.Context, tx pgx.Tx, queue string, limit int, idle time.Duration) ([]Claimed, error) {
	return lockClaim(ctx, tx, false, queue, limit, idle)
}

// BeginLockClaim is LockClaim on a connection that is not in a
// transaction: it begins the claim transaction in the same round trip.
// The transaction stays open on conn, whatever the outcome: close it with
// CloseLocked (or a ROLLBACK).
func BeginLockClaim(ctx context.Context, conn Batcher, queue string, limit int, idle time.Duration) ([]Claimed, error) {
	return lockClaim(ctx, conn, true, queue, limit, idle)
}

func lockClaim(ctx context.Context, db Batcher, begin bool, queue string, limit int, idle time.Duration) ([]Claimed, error) {
	b := &pgx.Batch{}
	if begin {
		b.Queue(`BEGIN`)
	}
	b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`,
		fmt.Sprintf("%dms", idle.Milliseconds()))
	b.Queue(lockClaimSQL, queue, limit)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if begin {
		if _, err := br.Exec(); err != nil {
			return nil, MapError(err)
		}
	}
	if _, err := br.Exec(); err != nil {
		return nil, MapError(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, MapError(err)
	}
	return scanClaimedRows(rows, true)
}

const promoteSQL = `WITH next AS (SELECT id FROM unnest($1::bigint[]) AS id LIMIT $2)` + leaseSQL

// completeLockedSQL runs in the claim transaction, so now() is the claim's
// time: leased_at and lease_owner record who claimed the effect and when,
// as they do after a durable lease.
const completeLockedSQL = `
UPDATE pgoutbox.effects e
SET state = 'completed', attempts = e.attempts + 1, leased_at = now(), lease_owner = $2,
    completed_at = statement_timestamp(), last_error = NULL
WHERE e.id = ANY($1) AND e.state::text = 'available'
RETURNING e.id, extract(epoch FROM statement_timestamp() - e.created_at)::float8`

// recordLockClaimSQL records the effects a row-lock batch locked
// (migration 00017), committed on its own with asynchronous commit (a
// worker's crash cannot lose a commit the server acknowledged; only a
// server crash can), and returns the record's id and those of the effects
// that an earlier, unclosed batch also recorded. $1 queue, $2 ids.
//
// It runs after the batch's locks are taken, so its snapshot sees the
// record of any batch that held one of these rows before: that batch
// committed its record before it delivered anything, and its lock is gone,
// so it ended without closing (its close deletes its record in the
// transaction that completes or leases the rows). Its effects were
// possibly delivered, and their attempt was never counted.
const recordLockClaimSQL = `
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
mine AS (
    INSERT INTO pgoutbox.lock_claims (queue, effect_ids) SELECT $1, $2::bigint[] FROM async RETURNING id
)
SELECT (SELECT id FROM mine), ARRAY(
    SELECT DISTINCT x FROM pgoutbox.lock_claims c CROSS JOIN LATERAL unnest(c.effect_ids) AS x
    WHERE c.queue = $1 AND c.effect_ids && $2::bigint[] AND x = ANY($2::bigint[]))`

// RecordLockClaim records, outside the claim transaction, the effects ids
// a row-lock batch of queue locked (LockClaim), and returns the record's id
// (for CloseLocked) and the ids, among them, that a batch which died
// holding them recorded before: like LockClaim's suspect rows, they must
// be promoted before they are delivered. Run it on a connection other than
// the claim transaction's, taken before the claim locked anything (never
// wait for a pool connection while holding the claim's row locks: see
// pgoutbox's acquireClaimPair), and deliver nothing before it returns.
func RecordLockClaim(ctx context.Context, db DBTX, queue string, ids []int64) (int64, []int64, error) {
	var id int64
	var crashed []int64
	if err := db.QueryRow(ctx, recordLockClaimSQL, queue, ids).Scan(&id, &crashed); err != nil {
		return 0, nil, MapError(err)
	}
	return id, crashed, nil
}

const forgetLockClaimSQL = `DELETE FROM pgoutbox.lock_claims WHERE id = $1`

// RollbackLocked ends, without writing anything, the claim transaction
// BeginLockClaim began on conn.
func RollbackLocked(ctx context.Context, conn DBTX) error {
	_, err := conn.Exec(ctx, `ROLLBACK`)
	return MapError(err)
}

// CloseLocked closes a row-lock batch in its claim transaction, in one
// round trip: it completes the effects done (counting their attempt: one
// write per effect over its whole delivery), turns the effects promote into
// durable leases owned by owner (counting an attempt, so they survive the
// end of the transaction), and deletes the batch's record (RecordLockClaim;
// 0: none). With commit set, db is the connection BeginLockClaim began the
// transaction on, and the same round trip commits it: an error means
// nothing was committed, and the transaction may still be open (aborted)
// on db. Without, db is the transaction, and the caller commits it.
func CloseLocked(ctx context.Context, db Batcher, commit bool, record int64, done, promote []int64, owner string, lease time.Duration) (Completed, []Claimed, error) {
	b := &pgx.Batch{}
	if len(done) > 0 {
		b.Queue(completeLockedSQL, done, owner)
	}
	if len(promote) > 0 {
		b.Queue(promoteSQL, promote, len(promote), owner, lease.Seconds(), 1)
	}
	if record != 0 {
		b.Queue(forgetLockClaimSQL, record)
	}
	if commit {
		b.Queue(`COMMIT`)
	}
	if b.Len() == 0 {
		return nil, nil, nil
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	var completed Completed
	var leases []Claimed
	if len(done) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, nil, MapError(err)
		}
		if completed, err = scanCompleted(rows, len(done)); err != nil {
			return nil, nil, err
		}
	}
	if len(promote) > 0 {
		rows, err := br.Query()
		if err != nil {
			return nil, nil, MapError(err)
		}
		if leases, err = scanClaimed(rows); err != nil {
			return nil, nil, err
		}
	}
	if record != 0 {
		if _, err := br.Exec(); err != nil {
			return nil, nil, MapError(err)
		}
	}
	if commit {
		// COMMIT of a transaction that failed reports ROLLBACK, not an error.
		tag, err := br.Exec()
		if err != nil {
			return nil, nil, MapError(err)
		}
		if tag.String() != "COMMIT" {
			return nil, nil, fmt.Errorf("store: closing a row-lock batch: the transaction ended with %s, not COMMIT", tag)
		}
	}
	return completed, leases, MapError(br.Close())
}

// Fence identifies a lease: the effect, its token and its expected type.
type Fence struct {
	ID    int64
	Token uuid.UUID
	Type  string
}

// Fence is the fence of a durable lease this claim wrote (Claim,
// ClaimRelay, Promote); a row-lock claim (LockClaim) has no token.
func (c Claimed) Fence() Fence { return Fence{ID: c.ID, Token: c.Token, Type: c.Type} }

// fenceArrays spreads fences into the statement's arrays, in id order:
// every multi-row fenced statement (complete, extend, hand-over) then locks
// its rows in the same order, so two of them never deadlock on the rows
// they share (an extension racing a group commit).
func fenceArrays(fs []Fence) ([]int64, []pgtype.UUID, []string) {
	sorted := slices.Clone(fs)
	slices.SortFunc(sorted, func(a, b Fence) int { return cmp.Compare(a.ID, b.ID) })
	ids, toks, types := make([]int64, len(fs)), make([]pgtype.UUID, len(fs)), make([]string, len(fs))
	for i, f := range sorted {
		ids[i], toks[i], types[i] = f.ID, pgUUID(f.Token), f.Type
	}
	return ids, toks, types
}

// pgUUID is a token as pgx's own UUID type. An array of uuid.UUID has no
// encoding in pgx's text-format query modes (exec, simple protocol: the
// modes that work through a transaction pooler, docs/poolers.md); an array
// of pgtype.UUID has one in every mode.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// fencedSQL locks each fenced row by primary key (one index probe per
// fence, whatever the statistics say about the lease index) and keeps the
// fences whose lease still matches, with the token that matched: two
// fences of one effect (a stale delivery and a fresh one of the same
// worker) may be in one statement, and only one of them holds the lease.
// $1, $2, $3: ids, tokens, effect types.
const fencedSQL = `
WITH fenced AS (
    SELECT x.id, f.token, f.effect_type
    FROM (SELECT * FROM unnest($1::bigint[], $2::uuid[], $3::text[]) AS u(id, token, effect_type) ORDER BY id) f
    CROSS JOIN LATERAL (
        SELECT e.id FROM pgoutbox.effects e
        WHERE e.id = f.id AND e.state::text = 'leased' AND e.lease_token = f.token AND e.effect_type = f.effect_type
        FOR UPDATE
    ) x
)`

const completeSQL = fencedSQL + `, done AS (
    UPDATE pgoutbox.effects e
    SET state = 'completed', completed_at = now(), lease_token = NULL, lease_expires_at = NULL, last_error = NULL
    WHERE e.id = ANY(ARRAY(SELECT id FROM fenced))
    RETURNING e.id, extract(epoch FROM now() - e.created_at)::float8 AS lag
)
SELECT d.id, f.token, f.effect_type, d.lag FROM done d JOIN fenced f ON f.id = d.id`

// Completed maps the id of each effect that was completed to its lag
// (creation to completion, database clock). Ids absent from the map were
// not completed.
type Completed map[int64]time.Duration

// FencesCompleted maps each fence that completed its effect to the lag
// (creation to completion, database clock). Fences absent from the map had
// lost their lease, also when another fence of the same effect completed it.
type FencesCompleted map[Fence]time.Duration

// Complete marks leased effects completed in one statement (a group commit
// when run on its own), fenced by id, token and type.
func Complete(ctx context.Context, db DBTX, fences []Fence) (FencesCompleted, error) {
	ids, toks, types := fenceArrays(fences)
	rows, err := db.Query(ctx, completeSQL, ids, toks, types)
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	out := make(FencesCompleted, len(fences))
	for rows.Next() {
		var f Fence
		var lag float64
		if err := rows.Scan(&f.ID, &f.Token, &f.Type, &lag); err != nil {
			return nil, err
		}
		out[f] = time.Duration(lag * float64(time.Second))
	}
	return out, MapError(rows.Err())
}

func scanCompleted(rows pgx.Rows, n int) (Completed, error) {
	defer rows.Close()
	out := make(Completed, n)
	for rows.Next() {
		var id int64
		var lag float64
		if err := rows.Scan(&id, &lag); err != nil {
			return nil, err
		}
		out[id] = time.Duration(lag * float64(time.Second))
	}
	return out, MapError(rows.Err())
}

// FailKind says where a failed delivery goes.
type FailKind string

// Failure routes.
const (
	// FailRetry: back to available after the delay, or dead_letter when
	// attempts are exhausted; clears delivery_started_at (the handler asserts
	// nothing was delivered).
	FailRetry FailKind = "retry"
	// FailDeadLetter: dead_letter now (a permanent failure).
	FailDeadLetter FailKind = "dead_letter"
	// FailReconcile: reconciliation_required (outcome unknown, not replay-safe).
	FailReconcile FailKind = "reconcile"
	// FailRelease: a worker shutting down gives the effect back, routed like
	// every other recovery (pgoutbox.recovered_state): reconciliation_required
	// when delivery started, dead_letter when the interrupted attempt was the
	// last one (it counted when it was claimed), else available now.
	FailRelease FailKind = "release"
)

const failSQL = `
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
RETURNING e.state::text`

// Fail records a failed delivery, fenced; delay applies only when the effect
// returns to available. It returns the new state, or found=false when the
// lease was lost.
func Fail(ctx context.Context, db DBTX, f Fence, kind FailKind, delay time.Duration, lastError string) (state string, found bool, err error) {
	err = db.QueryRow(ctx, failSQL, f.ID, f.Token, f.Type, string(kind), delay.Seconds(), lastError).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, MapError(err)
	}
	return state, true, nil
}

const startSQL = `
UPDATE pgoutbox.effects SET delivery_started_at = now()
WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3
  AND lease_expires_at > now()`

// MarkStarted records, fenced, that delivery of a non-replay-safe effect is
// about to start. It must commit before the request is sent. found=false
// means the lease was lost, or has expired (lease_expires_at <= now(), even
// if no sweeper has recovered it yet): a worker whose lease expired must not
// start a dispatch the sweeper may already be handing to another worker.
// now() is the statement's start when it runs on its own; a start that
// waits for a row lock past the expiry can still commit, and the sweeper
// then sees it on the row it locks (recoverSet).
func MarkStarted(ctx context.Context, db DBTX, f Fence) (found bool, err error) {
	tag, err := db.Exec(ctx, startSQL, f.ID, f.Token, f.Type)
	if err != nil {
		return false, MapError(err)
	}
	return tag.RowsAffected() == 1, nil
}

// extendSQL never waits for another transaction: a fenced row that is
// locked (its own completion transaction running a job or transitions, a
// group commit, a sweeper) is skipped, not extended, and reported held when
// the statement's snapshot still shows the lease; the next round extends it
// or finds it lost. Waiting there would stall every lease of the batch, and
// every group commit behind them, for as long as the slowest job runs.
const extendSQL = `
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
SELECT l.id, l.token, l.effect_type FROM locked l WHERE l.id IN (SELECT id FROM extended)`

// Extend pushes the leases of in-flight effects to now()+lease in one
// statement and returns the fences still held; a missing fence lost its
// lease (also when another fence of the same effect holds it). It never
// waits for a row lock: a locked row is left as it is and reported held
// while its lease still matches (see extendSQL).
func Extend(ctx context.Context, db DBTX, fences []Fence, lease time.Duration) (map[Fence]bool, error) {
	ids, toks, types := fenceArrays(fences)
	rows, err := db.Query(ctx, extendSQL, ids, toks, types, lease.Seconds())
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	out := make(map[Fence]bool, len(fences))
	for rows.Next() {
		var f Fence
		if err := rows.Scan(&f.ID, &f.Token, &f.Type); err != nil {
			return nil, err
		}
		out[f] = true
	}
	return out, MapError(rows.Err())
}

// Rescued is one effect moved by the sweeper.
type Rescued struct {
	ID    int64
	Queue string
	Type  string
	State string
}

const sweepSQL = `
WITH expired AS (
    SELECT id FROM pgoutbox.effects
    WHERE state = 'leased' AND lease_expires_at < now() - make_interval(secs => $2)
      AND ($3::text IS NULL OR queue = $3)
    ORDER BY lease_expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE pgoutbox.effects e
SET ` + recoverSet + `,
    last_error = 'lease expired (owner ' || coalesce(e.lease_owner, '?') || ')'
FROM expired x
WHERE e.id = x.id AND e.state::text = 'leased'
RETURNING e.id, e.queue, e.effect_type, e.state::text`

// recoverSet routes a recovered lease (sweep, requeue-stale) by
// pgoutbox.recovered_state of the row being updated. Every e.* in a SET
// list is the row the UPDATE locked: when a concurrent transaction changed
// it after the statement's snapshot (a late worker committing
// delivery_started_at), PostgreSQL re-reads the newest version before
// evaluating the SET list. A route computed in a CTE that re-reads the
// table would see the snapshot's version instead and could send a started
// dispatch back to available.
const recoverSet = `state = pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts),
    available_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'available'
        THEN now() ELSE e.available_at END,
    dead_lettered_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'dead_letter'
        THEN now() END,
    reconciliation_at = CASE WHEN pgoutbox.recovered_state(e.delivery_started_at, e.attempts, e.max_attempts) = 'reconciliation_required'
        THEN now() END,
    lease_token = NULL, lease_expires_at = NULL`

// Sweep recovers up to limit leases that expired more than grace ago
// (database clock), routed by pgoutbox.recovered_state (migration 00002), the
// one definition shared with requeue-stale and shutdown releases: a started
// non-replay-safe effect goes to reconciliation_required, an exhausted one to
// dead_letter, any other back to available. The route is decided from the
// locked row (recoverSet), never from the statement's snapshot. Concurrent
// sweepers skip each other's rows, so each lease is recovered once.
func Sweep(ctx context.Context, db DBTX, limit int, grace time.Duration) ([]Rescued, error) {
	rows, err := db.Query(ctx, sweepSQL, limit, grace.Seconds(), nil)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Rescued, error) {
		var x Rescued
		err := r.Scan(&x.ID, &x.Queue, &x.Type, &x.State)
		return x, err
	})
	return out, MapError(err)
}

// pruneSQL deletes up to $2 completed effects older than $1 seconds.
//
// The batch is picked by an array subquery, which runs once (an InitPlan):
// under "id IN (SELECT … LIMIT … FOR UPDATE SKIP LOCKED)" the planner may
// join the locking subquery and rescan it, and one prune was seen to run
// for over five minutes on 20,000 rows (issue 32's benchmark).
const pruneSQL = `
DELETE FROM pgoutbox.effects
WHERE id = ANY(ARRAY(
    SELECT id FROM pgoutbox.effects
    WHERE state = 'completed' AND completed_at < now() - make_interval(secs => $1)
    ORDER BY completed_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`

// Prune deletes up to limit completed effects older than retention and
// returns how many it deleted. Dead letters and reconciliation records are
// never pruned. The effects' key rows stay (PruneKeys deletes them later).
func Prune(ctx context.Context, db DBTX, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneSQL, retention.Seconds(), limit)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

// pruneKeysSQL deletes the oldest key rows past the key retention whose
// effect no longer exists (migration 00007): one primary-key probe of the
// effects per candidate. A key whose effect is kept (a dead letter, a
// reconciliation record, a completed effect within its own retention) is
// never deleted.
const pruneKeysSQL = `
DELETE FROM pgoutbox.effect_keys
WHERE ctid = ANY(ARRAY(
    SELECT k.ctid FROM pgoutbox.effect_keys k
    WHERE k.created_at < now() - make_interval(secs => $1)
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.effects e WHERE e.id = k.effect_id)
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.stream s WHERE s.queue = k.queue AND s.id = k.effect_id)
    ORDER BY k.created_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))`

// PruneKeys deletes up to limit idempotency keys first enqueued more than
// retention ago (database clock) whose effect is gone, and returns how many
// it deleted. Until then enqueuing such a key returns the pruned effect's id
// and writes nothing.
func PruneKeys(ctx context.Context, db DBTX, retention time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneKeysSQL, retention.Seconds(), limit)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

// pruneNotifyPendingSQL deletes the notify_pending rows (migration 00011)
// of backends that are gone. A row only exists to queue its transaction's
// deferred NOTIFY trigger, which has fired by the time the transaction
// commits, so the row of a committed transaction is dead weight; a row a
// transaction has written and not yet committed is either invisible here
// (a first insert) or row-locked (an update), and SKIP LOCKED leaves it,
// so the cleanup never waits and never takes a pending notification away,
// even when a new backend has reused a dead backend's pid.
const pruneNotifyPendingSQL = `
DELETE FROM pgoutbox.notify_pending
WHERE pid = ANY(ARRAY(
    SELECT p.pid FROM pgoutbox.notify_pending p
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = p.pid)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
))`

// PruneNotifyPending deletes up to limit rows of pgoutbox.notify_pending
// whose backend pid is no longer live (not in pg_stat_activity) and returns
// how many it deleted. The table has one row per backend that ever enqueued,
// so without this it grows with connection churn.
func PruneNotifyPending(ctx context.Context, db DBTX, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneNotifyPendingSQL, limit)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

// pruneLockClaimsSQL deletes records of row-lock batches (migration 00017)
// none of whose effects is still available with no attempt counted: for
// those effects the record has done its work (they were completed, leased,
// retried or deleted since). An open batch's effects are available with no
// attempt until it closes, so its record is kept. $1 limit.
const pruneLockClaimsSQL = `
DELETE FROM pgoutbox.lock_claims
WHERE id = ANY(ARRAY(
    SELECT c.id FROM pgoutbox.lock_claims c
    WHERE NOT EXISTS (
        SELECT 1 FROM pgoutbox.effects e
        WHERE e.id = ANY(c.effect_ids) AND e.state::text = 'available' AND e.attempts = 0)
    ORDER BY c.id
    LIMIT $1
))`

// PruneLockClaims deletes up to limit records left by row-lock batches that
// never closed (RecordLockClaim) once none of their effects needs them,
// and returns how many it deleted.
func PruneLockClaims(ctx context.Context, db DBTX, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneLockClaimsSQL, limit)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

const resolveSQL = `
UPDATE pgoutbox.effects
SET state = 'completed', completed_at = now(), resolution = $3
WHERE id = $1 AND state::text = 'reconciliation_required' AND effect_type = $2
RETURNING id`

// Resolve closes a reconciliation record as completed with the operator's
// recorded resolution. found=false: no such record of that type.
func Resolve(ctx context.Context, db DBTX, id int64, effectType string, resolution []byte) (found bool, err error) {
	// As text: in pgx's exec and simple-protocol modes (docs/poolers.md) a
	// []byte is sent as bytea, which is not JSON.
	tag, err := db.Exec(ctx, resolveSQL, id, effectType, string(resolution))
	if err != nil {
		return false, MapError(err)
	}
	return tag.RowsAffected() == 1, nil
}

// Record is an effect as operators see it (no lease token).
type Record struct {
	ID                int64
	Queue             string
	Type              string
	Key               string
	State             string
	Attempts          int
	MaxAttempts       int
	Payload           []byte
	CreatedAt         time.Time
	DeliveryStartedAt *time.Time
	LastError         *string
}

const getSQL = `
SELECT id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, payload,
    created_at, delivery_started_at, last_error
FROM pgoutbox.effects WHERE id = $1`

// Get loads one effect; found=false when it does not exist.
func Get(ctx context.Context, db DBTX, id int64) (Record, bool, error) {
	var r Record
	err := db.QueryRow(ctx, getSQL, id).Scan(&r.ID, &r.Queue, &r.Type, &r.Key, &r.State, &r.Attempts,
		&r.MaxAttempts, &r.Payload, &r.CreatedAt, &r.DeliveryStartedAt, &r.LastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, MapError(err)
}

const listStateSQL = `
SELECT id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, payload,
    created_at, delivery_started_at, last_error
FROM pgoutbox.effects
WHERE state = $1::pgoutbox.effect_state AND ($2 = '' OR queue = $2)
ORDER BY id
LIMIT $3`

// ListState lists up to limit effects in state (optionally of one queue),
// oldest first.
func ListState(ctx context.Context, db DBTX, state, queue string, limit int) ([]Record, error) {
	rows, err := db.Query(ctx, listStateSQL, state, queue, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		err := row.Scan(&r.ID, &r.Queue, &r.Type, &r.Key, &r.State, &r.Attempts, &r.MaxAttempts, &r.Payload,
			&r.CreatedAt, &r.DeliveryStartedAt, &r.LastError)
		return r, err
	})
	return out, MapError(err)
}

// nextDueSQL finds the earliest available effect of a queue that is not yet
// due (a retry's backoff, a scheduled effect): a range scan of
// effects_claim_idx that starts after now(), so it never walks the due head
// of the queue or its recently claimed (dead) entries. A parked effect
// (available_at 'infinity', migration 00014) is not due at any time: its
// un-park wakes the queue. $1 queue.
const nextDueSQL = `
SELECT extract(epoch FROM e.available_at - now())::float8
FROM pgoutbox.effects e
WHERE e.state = 'available' AND e.queue = $1 AND e.available_at > now() AND e.available_at < 'infinity'
ORDER BY e.available_at, e.id
LIMIT 1`

// NextDue returns how long, on the database clock, until the earliest
// available effect of queue that is not yet claimable falls due; ok is false
// when the queue has none.
func NextDue(ctx context.Context, db DBTX, queue string) (in time.Duration, ok bool, err error) {
	var secs float64
	err = db.QueryRow(ctx, nextDueSQL, queue).Scan(&secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, MapError(err)
	}
	return time.Duration(secs * float64(time.Second)), true, nil
}

// backendPIDSQL names the server process a statement runs in.
const backendPIDSQL = `SELECT pg_backend_pid()`

// BackendPID returns the PostgreSQL backend that runs a statement on db. It
// uses the simple protocol, so it answers whatever the connection's query
// mode (the transaction-pooler probe runs it before the mode is checked).
func BackendPID(ctx context.Context, db DBTX) (int32, error) {
	var pid int32
	err := db.QueryRow(ctx, backendPIDSQL, pgx.QueryExecModeSimpleProtocol).Scan(&pid)
	return pid, err
}
