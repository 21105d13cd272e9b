package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// ceilingSystem is the physical limit pgoutbox is measured against: the
// minimal SQL lifecycle on pgoutbox's own table (pgoutbox's migrations, so
// the same columns, indexes and triggers), driven by a tight Go loop with pgx
// and no engine code. Two variants:
//
//   - ceiling: the durable-lease lifecycle. A loop claims a batch with one
//     UPDATE … WHERE id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED LIMIT k))
//     RETURNING (its own transaction), then completes the batch with one
//     fenced UPDATE (a second transaction).
//   - ceiling[row-lock]: the row-lock lifecycle. One transaction per batch:
//     SELECT … FOR UPDATE SKIP LOCKED LIMIT k, then one UPDATE to completed.
//   - ceiling[delete]: a queue that forgets on success. One statement per
//     batch, DELETE … WHERE id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED
//     LIMIT k)) RETURNING id, payload, and no completion write at all: the physical
//     limit of any design that keeps a row per pending effect. The table's
//     statement trigger on DELETE (effect_attempts' cleanup) fires once per
//     batch; the key rows stay, as they do for pgoutbox's own retention.
//
// Inserts are one INSERT … SELECT FROM unnest(keys, payloads) per batch; the
// key rows come from the table's statement trigger, as for any plain-SQL
// insert.
type ceilingSystem struct {
	name         string
	rowLock      bool
	delete       bool // ceiling[delete]
	loops        int  // concurrent claim/complete loops, one connection each
	batch        int  // effects per claim
	payloadBytes int
}

func (s *ceilingSystem) Name() string     { return s.name }
func (s *ceilingSystem) Tables() []string { return (&pgSystem{}).Tables() }
func (s *ceilingSystem) Migrate(ctx context.Context, dsn string) error {
	return (&pgSystem{}).Migrate(ctx, dsn)
}
func (s *ceilingSystem) DiagnoseSQL() string { return (&pgSystem{}).DiagnoseSQL() }

// ClaimLatencySQL: both variants write leased_at at claim (the row-lock
// variant in its only transaction, whose now() is the claim's time).
// The delete variant leaves no row to read: not measured.
func (s *ceilingSystem) ClaimLatencySQL() string {
	if s.delete {
		return ""
	}
	return `SELECT id, available_at, leased_at FROM pgoutbox.effects WHERE leased_at IS NOT NULL`
}

func (s *ceilingSystem) Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	return (&pgSystem{}).Retention(ctx, pool)
}

// supports: the ceiling is a throughput limit; the latency scenario would
// measure its idle poll, so it runs only where throughput is measured.
func (s *ceilingSystem) supports(scenario string) bool {
	return scenario != "latency"
}

func (s *ceilingSystem) Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error) {
	payload, err := json.Marshal(newArgs(s.payloadBytes))
	if err != nil {
		return nil, err
	}
	// A claim never takes more than the scenario's worker count, as
	// pgoutbox's ClaimBatch is capped at Concurrency.
	sys := *s
	sys.batch = max(1, min(s.batch, wc.workers))
	return &ceilingRunner{sys: &sys, pool: pool, payload: string(payload), onWork: wc.onWork, loops: loops{completed: &benchrun.Counter{}}}, nil
}

type ceilingRunner struct {
	sys     *ceilingSystem
	pool    *pgxpool.Pool
	payload string
	onWork  func(id int64)
	loops
}

const ceilingInsert = `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
SELECT $1, $2, k, p::jsonb FROM unnest($3::text[], $4::text[]) AS t(k, p)`

func (r *ceilingRunner) InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error {
	keys := make([]string, n)
	payloads := make([]string, n)
	for i := range keys {
		keys[i] = pgoutbox.Key("bench", strconv.Itoa(seq+i))
		payloads[i] = r.payload
	}
	_, err := db.Exec(ctx, ceilingInsert, pgQueue, pgType, keys, payloads)
	return err
}

func (r *ceilingRunner) InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
		VALUES ($1, $2, $3, $4::jsonb) RETURNING id`, pgQueue, pgType, pgoutbox.Key("bench", strconv.Itoa(seq)), r.payload).Scan(&id)
	return id, err
}

// The claim of the durable variant: the columns the lease consistency check
// requires (state, lease_token, lease_expires_at), the attempt and leased_at.
// One lease token per batch fences the batch's completion.
const ceilingClaim = `UPDATE pgoutbox.effects
SET state = 'leased', attempts = attempts + 1, leased_at = now(), lease_token = $3,
    lease_expires_at = now() + interval '60 seconds'
WHERE id = ANY(ARRAY(
    SELECT id FROM pgoutbox.effects
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
    ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED))
RETURNING id, payload`

const ceilingComplete = `UPDATE pgoutbox.effects
SET state = 'completed', completed_at = now(), lease_token = NULL, lease_expires_at = NULL
WHERE id = ANY($1::bigint[]) AND lease_token = $2`

const ceilingLock = `SELECT id, payload FROM pgoutbox.effects
WHERE state = 'available' AND queue = $1 AND available_at <= now()
ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED`

const ceilingLockComplete = `UPDATE pgoutbox.effects
SET state = 'completed', attempts = attempts + 1, leased_at = now(), completed_at = now()
WHERE id = ANY($1::bigint[])`

func (r *ceilingRunner) Start(ctx context.Context) error {
	cctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for range max(1, r.sys.loops) {
		r.done.Go(func() { r.loop(cctx) })
	}
	return nil
}

// loop claims and completes batches until ctx ends. An empty claim backs off
// from 0.5 ms to 8 ms (the ceiling does not LISTEN).
func (r *ceilingRunner) loop(ctx context.Context) {
	idle := time.Duration(0)
	var token [16]byte
	var seq uint64
	for ctx.Err() == nil {
		seq++
		var n int
		var err error
		switch {
		case r.sys.delete:
			n, err = r.deleteBatch(ctx)
		case r.sys.rowLock:
			n, err = r.rowLockBatch(ctx)
		default:
			// A fresh token per batch: random enough within one run.
			t := time.Now().UnixNano()
			for i := range 8 {
				token[i] = byte(t >> (8 * i))
				token[8+i] = byte(seq >> (8 * i))
			}
			n, err = r.durableBatch(ctx, token)
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			r.fail(ctx, err)
			idle = 10 * time.Millisecond
		}
		if n > 0 {
			idle = 0
			r.completed.Add(int64(n))
			continue
		}
		idle = min(max(idle*2, 500*time.Microsecond), 8*time.Millisecond)
		select {
		case <-ctx.Done():
		case <-time.After(idle):
		}
	}
}

func (r *ceilingRunner) deliver(ids []int64) {
	if r.onWork != nil {
		for _, id := range ids {
			r.onWork(id)
		}
	}
}

func (r *ceilingRunner) durableBatch(ctx context.Context, token [16]byte) (int, error) {
	rows, err := r.pool.Query(ctx, ceilingClaim, pgQueue, r.sys.batch, token)
	if err != nil {
		return 0, err
	}
	ids, err := scanIDs(rows)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	r.deliver(ids)
	if _, err := r.pool.Exec(ctx, ceilingComplete, ids, token); err != nil {
		return 0, err
	}
	return len(ids), nil
}

// ceilingDelete is the delete variant's whole lifecycle of a batch. The
// batch is chosen as an InitPlan (id = ANY(ARRAY(…)), as in ceilingClaim),
// not as a semi-join (id IN (…)): the same rows, but the locking subquery
// runs once whatever the table's statistics say. A semi-join planned on
// stale statistics can rescan it per outer row; the engine's prune, which
// has that shape, once ran for more than 5 minutes on 20,000 rows here.
const ceilingDelete = `DELETE FROM pgoutbox.effects
WHERE id = ANY(ARRAY(
    SELECT id FROM pgoutbox.effects
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
    ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED))
RETURNING id, payload`

func (r *ceilingRunner) deleteBatch(ctx context.Context) (int, error) {
	rows, err := r.pool.Query(ctx, ceilingDelete, pgQueue, r.sys.batch)
	if err != nil {
		return 0, err
	}
	ids, err := scanIDs(rows)
	if err != nil {
		return 0, err
	}
	r.deliver(ids)
	return len(ids), nil
}

func (r *ceilingRunner) rowLockBatch(ctx context.Context) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, ceilingLock, pgQueue, r.sys.batch)
		if err != nil {
			return err
		}
		ids, err := scanIDs(rows)
		if err != nil || len(ids) == 0 {
			return err
		}
		r.deliver(ids)
		if _, err := tx.Exec(ctx, ceilingLockComplete, ids); err != nil {
			return err
		}
		n = len(ids)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// scanIDs reads (id, payload) rows; the payload is read as a delivery would.
func scanIDs(rows pgx.Rows) ([]int64, error) {
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
