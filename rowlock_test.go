package pgoutbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// A row-lock queue completes a replay-safe effect with one write: the row
// goes from available to completed and never carries a durable lease.
func TestRowLockCompletesWithOneWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	// The client gets its own pool: closing it ends its backends, which
	// flush their statistics (n_tup_upd) when they exit.
	pool, err := pgxpool.New(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		ID:     "rowlock-worker",
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 50, ClaimBatch: 20, RowLockLease: 5 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
			calls.Add(1)
			return nil
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, c)
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	effects := make([]pgoutbox.Effect, 500)
	for i := range effects {
		effects[i] = pgoutbox.Effect{Queue: "q", Type: "safe", Key: fmt.Sprint(i)}
	}
	ids := b.enqueue(t, effects...)
	for _, id := range ids {
		b.waitEvent(t, events, id, "completed")
	}
	if err := c.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND attempts = 1
		AND lease_owner = 'rowlock-worker' AND leased_at <= completed_at AND lease_token IS NULL`); n != 500 {
		t.Fatalf("%d effects completed with one attempt, claim time and owner recorded; want 500", n)
	}
	if calls.Load() != 500 {
		t.Fatalf("handler called %d times, want 500", calls.Load())
	}
	// Every row was updated once: durable leases would make it 1,000.
	updates := func() int64 {
		return b.scalar(t, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = 'pgoutbox' AND relname = 'effects'`)
	}
	b.waitFor(t, "the workers' statistics", func() bool { return updates() >= 500 })
	if n := updates(); n != 500 {
		t.Fatalf("%d row updates for 500 effects, want 500", n)
	}
}

// A handler that outlives the hold is promoted to a durable lease when the
// batch closes, while the rest of its batch completes; it then completes
// through the fenced path.
func TestRowLockStragglerIsPromoted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 10, RowLockLease: 100 * time.Millisecond}},
		Types: []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			if d.Key == "slow" {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}}},
	})
	events := watch(t, c)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "slow"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "a"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "b"},
	)
	b.waitEvent(t, events, ids[1], "completed")
	b.waitEvent(t, events, ids[2], "completed")
	// The others' completion committed with the straggler's promotion.
	if r := b.row(t, ids[0]); r.State != "leased" || r.Token == nil || r.Attempts != 1 {
		t.Fatalf("straggler after its batch closed: %+v, want leased with attempt 1", r)
	}
	close(release)
	b.waitEvent(t, events, ids[0], "completed")
	if r := b.row(t, ids[0]); r.State != "completed" || r.Attempts != 1 || r.Token != nil {
		t.Fatalf("straggler: %+v, want completed with attempt 1", r)
	}
}

// When the claim transaction's connection dies, the lock (the lease) is gone:
// the effect is delivered again, and the first delivery's completion writes
// nothing (its commit fails) and reports the lease lost.
func TestRowLockLostConnectionRedelivers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var calls atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	c := b.startClient(t, pgoutbox.Config{
		PollInterval: 50 * time.Millisecond,
		// Row storage whatever the test matrix says: the test kills a
		// row-lock claim transaction.
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 10, RowLockLease: 20 * time.Second,
			Storage: pgoutbox.StorageRows}},
		Types: []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			if calls.Add(1) == 1 {
				close(started)
				<-release
			}
			return nil
		}}},
	})
	events := watch(t, c)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "k"})[0]
	<-started
	// The batch holds a row lock, so its transaction has an xid; a claim
	// of the worker's poll that found nothing, between its claim and its
	// rollback, has none.
	if n := b.scalar(t, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xid IS NOT NULL`); n != 1 {
		close(release)
		t.Fatalf("terminated %d claim transactions, want 1", n)
	}
	b.waitEvent(t, events, id, "completed")
	if r := b.row(t, id); r.State != "completed" || r.Attempts != 1 {
		t.Fatalf("after redelivery: %+v, want completed with attempt 1", r)
	}
	before := b.rowJSON(t, id)
	close(release)
	if e := b.waitEvent(t, events, id, ""); e.Outcome != pgoutbox.OutcomeLeaseLost {
		t.Fatalf("first delivery's outcome %s, want lease_lost", e.Outcome)
	}
	if after := b.rowJSON(t, id); after != before {
		t.Fatalf("the lost batch wrote to the row:\n%s\n%s", before, after)
	}
	if calls.Load() != 2 {
		t.Fatalf("handler called %d times, want 2", calls.Load())
	}
}

// A closed batch leaves no record, and Prune deletes the record of a batch
// that died (pgoutbox.lock_claims, migration 00017) once none of its
// effects is still available with no attempt, keeping one that still
// marks such an effect.
func TestRowLockRecordsAreClosedAndPruned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "done"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "waiting"},
	)
	// Two records of dead batches: one names the effect that completes
	// below, the other the one that stays available.
	for _, id := range ids {
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.lock_claims (queue, effect_ids) VALUES ('q', ARRAY[$1::bigint])`, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET state = 'completed', completed_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prune(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.lock_claims WHERE $1 = ANY(effect_ids)`, ids[0]); n != 0 {
		t.Errorf("the record of a completed effect was kept")
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.lock_claims WHERE $1 = ANY(effect_ids)`, ids[1]); n != 1 {
		t.Fatalf("the record of an effect still available with no attempt was pruned")
	}
	// The next claim delivers the marked effect under a durable lease, and
	// its batches' own records are gone once they closed.
	var token atomic.Value
	b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: 5 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			token.Store(d.LeaseToken)
			return nil
		}}},
	})
	b.waitFor(t, "the marked effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'`, ids[1]) == 1
	})
	if tok, _ := token.Load().(string); tok == "" {
		t.Errorf("the effect a dead batch recorded was delivered under a row lock, want a durable lease")
	}
	b.waitFor(t, "the claiming batch closed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`) == 0
	})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.lock_claims`); n != 1 {
		t.Fatalf("%d records after the batch closed, want 1 (the dead batch's: a closed batch deletes its own)", n)
	}
	if _, err := c.Prune(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.lock_claims`); n != 0 {
		t.Fatalf("%d records left after the queue drained and Prune ran, want 0", n)
	}
}

// A row-lock claim takes both of its pool connections (the claim
// transaction's and its record's) before it locks any row. Taking the
// record's after the claim deadlocked under load: the claim's SELECT … FOR
// UPDATE keeps the lock of a row it re-checked and dropped, the statements
// of that row's durable lease wait for it holding the pool's other
// connections, and the claim waited for one of them until the server ended
// it (issue 28, point 3). Every acquire of the claim is traced: at its
// start, no transaction of the client's pool may hold row locks (the pool
// has three connections, so a queue keeps at most one batch open, and the
// claim loop claims only when none is).
func TestRowLockClaimHoldsNoLockWhileAcquiring(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outside, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close(context.Background())
	tr := &claimAcquireTracer{ctx: b.ctx, outside: outside}
	pc, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 3
	pc.ConnConfig.Tracer = tr
	pc.ConnConfig.RuntimeParams["application_name"] = claimTestApp
	pool, err := pgxpool.NewWithConfig(b.ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: 5 * time.Second}},
		Types:  []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(b.ctx) }()
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: fmt.Sprint("e", i)})...)
		b.waitFor(t, "the effect completed", func() bool {
			return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == int64(len(ids))
		})
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.err != nil {
		t.Fatal(tr.err)
	}
	if tr.claims < 2 {
		t.Fatalf("%d acquires by the row-lock claim traced, want at least 2 (one claim's two connections)", tr.claims)
	}
	if len(tr.open) > 0 {
		t.Fatalf("the row-lock claim waited for a pool connection while its claim transaction held row locks: %q", tr.open)
	}
}

// claimTestApp names the connections of the client's pool in
// TestRowLockClaimHoldsNoLockWhileAcquiring.
const claimTestApp = "pgoutbox-claim-acquire-test"

// claimAcquireTracer checks, at the start of every pool acquire made from
// the row-lock claim (pgoutbox's lockClaim), from a connection outside the
// pool, whether a transaction of the pool holds row locks while it waits
// for its client.
type claimAcquireTracer struct {
	ctx     context.Context
	outside *pgx.Conn

	mu     sync.Mutex
	claims int
	open   []string
	err    error
}

func (*claimAcquireTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (*claimAcquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *claimAcquireTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*queueWorker).lockClaim") {
			break
		}
		if !more {
			return ctx
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.claims++
	// A transaction of the client's pool that holds locks (it has a
	// transaction id) and waits for its client: an open claim.
	rows, err := tr.outside.Query(tr.ctx, `SELECT left(regexp_replace(query, '\s+', ' ', 'g'), 60)
		FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1
		  AND state LIKE 'idle in transaction%' AND backend_xid IS NOT NULL`, claimTestApp)
	if err == nil {
		var open []string
		open, err = pgx.CollectRows(rows, pgx.RowTo[string])
		tr.open = append(tr.open, open...)
	}
	if err != nil && tr.err == nil {
		tr.err = err
	}
	return ctx
}

func (*claimAcquireTracer) TraceAcquireEnd(context.Context, *pgxpool.Pool, pgxpool.TraceAcquireEndData) {
}

// A batch whose claim record cannot be written delivers nothing: it rolls
// back, its effect stays available with no attempt, and the claim loop
// backs off like after a failed claim; once records can be written again
// the effect is delivered.
func TestRowLockBatchWithoutRecordDeliversNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE pgoutbox.lock_claims ADD CONSTRAINT refuse_records CHECK (false) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "a"})
	logs := newLogCapture()
	var calls atomic.Int64
	b.startClient(t, pgoutbox.Config{
		Logger: logs.Logger(),
		Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: 5 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
			calls.Add(1)
			return nil
		}}},
	})
	b.waitFor(t, "a failed claim, or a delivery", func() bool {
		return calls.Load() > 0 || len(logs.matching(func(r slog.Record) bool {
			return strings.HasPrefix(r.Message, "claim failed") && strings.Contains(attr(r, "err").String(), "refuse_records")
		})) > 0
	})
	if n := calls.Load(); n != 0 {
		t.Fatalf("the handler ran %d times although the batch's claim record was refused, want 0", n)
	}
	if r := b.row(t, ids[0]); r.State != "available" || r.Attempts != 0 {
		t.Fatalf("effect after a refused record: %+v, want available with no attempt", r)
	}
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE pgoutbox.lock_claims DROP CONSTRAINT refuse_records`); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the effect completed once records could be written", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'`, ids[0]) == 1
	})
	if n := calls.Load(); n != 1 {
		t.Fatalf("handler called %d times, want 1", n)
	}
}
