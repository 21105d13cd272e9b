package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// holdSQL installs a test fixture in the test's own database: every UPDATE
// of pgoutbox.effects run by a session that set pgoutbox_test.hold = 'on'
// waits, in a BEFORE ... FOR EACH STATEMENT trigger, for the advisory lock
// holdKey. That trigger fires after the statement took its snapshot and
// before it locked any row: exactly the window in which a late worker's
// commit changes a row the statement is about to lock.
const holdSQL = `
CREATE FUNCTION public.hold_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pgoutbox_test.hold', true) = 'on' THEN
        PERFORM pg_advisory_lock(4242);
        PERFORM pg_advisory_unlock(4242);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER hold_updates BEFORE UPDATE ON pgoutbox.effects
    FOR EACH STATEMENT EXECUTE FUNCTION public.hold_statement();`

const holdKey = 4242

type fixture struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &fixture{ctx: ctx, pool: pool}
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// insertOne enqueues one effect and returns its id.
func (f *fixture) insertOne(t *testing.T, key string, maxAttempts int) int64 {
	t.Helper()
	res, err := Insert(f.ctx, f.pool, []NewEffect{{Queue: "q", Type: "t", Key: key, Payload: []byte(`{}`), MaxAttempts: maxAttempts}})
	if err != nil {
		t.Fatal(err)
	}
	return res[0].ID
}

// claimOne leases the one available effect of queue q for an hour.
func (f *fixture) claimOne(t *testing.T) Claimed {
	t.Helper()
	c, err := Claim(f.ctx, f.pool, "q", "late-worker", 1, time.Hour)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v, %d effects", err, len(c))
	}
	return c[0]
}

func (f *fixture) get(t *testing.T, id int64) Record {
	t.Helper()
	r, found, err := Get(f.ctx, f.pool, id)
	if err != nil || !found {
		t.Fatalf("get %d: found=%v, %v", id, found, err)
	}
	return r
}

// held is a connection whose UPDATEs of effects wait for holdKey, and the
// connection that holds holdKey.
type held struct {
	run    *pgxpool.Conn // the held statement runs here
	holder *pgxpool.Conn
}

// hold installs the fixture, takes holdKey and returns a connection whose
// UPDATEs will wait for it.
func (f *fixture) hold(t *testing.T) *held {
	t.Helper()
	f.exec(t, holdSQL)
	h := &held{}
	var err error
	if h.holder, err = f.pool.Acquire(f.ctx); err != nil {
		t.Fatal(err)
	}
	if h.run, err = f.pool.Acquire(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Closed, not returned: their session settings and locks must not
		// leak into the pool.
		for _, c := range []*pgxpool.Conn{h.holder, h.run} {
			_ = c.Conn().Close(context.Background())
			c.Release()
		}
	})
	if _, err := h.holder.Exec(f.ctx, `SELECT pg_advisory_lock($1)`, holdKey); err != nil {
		t.Fatal(err)
	}
	if _, err := h.run.Exec(f.ctx, `SET pgoutbox_test.hold = 'on'`); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *held) release(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := h.holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, holdKey); err != nil {
		t.Fatal(err)
	}
}

// waitBlocked waits until the backend pid waits for a lock (a condition,
// polled; the context is the safety net).
func (f *fixture) waitBlocked(t *testing.T, pid uint32, what string) {
	t.Helper()
	for {
		var waiting bool
		if err := f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)`,
			int32(pid)).Scan(&waiting); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if waiting {
			return
		}
		select {
		case <-f.ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Defect 1 (issue #11), the sweep: a late worker whose lease has expired
// commits delivery_started_at after the sweep took its snapshot and before
// it locked the row. The sweep must route from the row it locked (started:
// reconciliation_required), never from its snapshot (not started:
// available, where the next claimer sends the request again while the late
// worker sends it too).
//
// The late worker's start is a statement whose clock (now(), its
// transaction's start) predates the expiry, so it passes the expiry fence:
// the case of a start that waited for a row lock past the expiry.
func TestSweepRoutesFromTheLockedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.insertOne(t, "k", 8)
	c := f.claimOne(t)
	h := f.hold(t)

	late, err := f.pool.Begin(f.ctx) // now() is fixed here, before the expiry
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(context.Background()) }()
	if _, err := late.Exec(f.ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	// The lease expires now, after the late worker's clock, before the sweep's.
	f.exec(t, `UPDATE pgoutbox.effects SET lease_expires_at = clock_timestamp() WHERE id = $1`, id)

	type result struct {
		rescued []Rescued
		err     error
	}
	swept := make(chan result, 1)
	go func() {
		r, err := Sweep(f.ctx, h.run, 10, 0)
		swept <- result{r, err}
	}()
	f.waitBlocked(t, h.run.Conn().PgConn().PID(), "the sweep to hold after its snapshot")

	started, err := MarkStarted(f.ctx, late, c.Fence())
	if err != nil {
		t.Fatal(err)
	}
	if !started {
		t.Fatal("the late worker's start (clock before the expiry) was refused; the interleaving did not happen")
	}
	if err := late.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	h.release(t, f.ctx)
	r := <-swept
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.rescued) != 1 || r.rescued[0].State != "reconciliation_required" {
		t.Fatalf("sweep of a lease whose delivery started during the sweep: %+v, want one effect to reconciliation_required", r.rescued)
	}
	if got := f.get(t, id); got.State != "reconciliation_required" || got.DeliveryStartedAt == nil {
		t.Fatalf("effect after the sweep: state %s, started %v; want reconciliation_required, started", got.State, got.DeliveryStartedAt)
	}
}

// Defect 1 (issue #11), requeue-stale: it takes live leases (a stalled
// worker's lease is kept alive by its extender), so the worker's start
// passes every fence; committed between the requeue's snapshot and its
// lock, it must still route the effect to reconciliation_required.
func TestRequeueStaleRoutesFromTheLockedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.insertOne(t, "k", 8)
	c := f.claimOne(t)
	h := f.hold(t)

	type result struct {
		moved []Moved
		err   error
	}
	requeued := make(chan result, 1)
	go func() {
		m, err := RequeueStale(f.ctx, h.run, 0, OpsFilter{}, 10)
		requeued <- result{m, err}
	}()
	f.waitBlocked(t, h.run.Conn().PgConn().PID(), "requeue-stale to hold after its snapshot")
	started, err := MarkStarted(f.ctx, f.pool, c.Fence())
	if err != nil || !started {
		t.Fatalf("the stalled worker's start on its live lease: started=%v, %v", started, err)
	}
	h.release(t, f.ctx)
	r := <-requeued
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.moved) != 1 || r.moved[0].State != "reconciliation_required" || r.moved[0].Owner != "late-worker" {
		t.Fatalf("requeue-stale of a lease whose delivery started during it: %+v, want one effect of late-worker to reconciliation_required", r.moved)
	}
	if got := f.get(t, id); got.State != "reconciliation_required" {
		t.Fatalf("effect after requeue-stale: state %s, want reconciliation_required", got.State)
	}
}

// Defect 1 (issue #11), the fence: a worker whose lease has expired (not
// yet swept) cannot mark its delivery started; it learns it lost the lease
// and sends nothing, and the sweeper then routes the effect as never
// started.
func TestMarkStartedRefusesAnExpiredLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.insertOne(t, "k", 8)
	c := f.claimOne(t)
	f.exec(t, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id)
	started, err := MarkStarted(f.ctx, f.pool, c.Fence())
	if err != nil {
		t.Fatal(err)
	}
	if started {
		t.Fatal("MarkStarted on an expired lease succeeded: the worker would send while the sweeper hands the effect to another")
	}
	if got := f.get(t, id); got.DeliveryStartedAt != nil || got.State != "leased" {
		t.Fatalf("refused start changed the row: state %s, started %v", got.State, got.DeliveryStartedAt)
	}
	// A live lease still starts.
	id2 := f.insertOne(t, "k2", 8)
	c2 := f.claimOne(t)
	if started, err := MarkStarted(f.ctx, f.pool, Fence{ID: c2.ID, Token: c2.Token, Type: c2.Type}); err != nil || !started {
		t.Fatalf("MarkStarted on a live lease: started=%v, %v", started, err)
	}
	if got := f.get(t, id2); got.DeliveryStartedAt == nil {
		t.Fatal("a live lease's start was not recorded")
	}
}

// Defect 5 (issue #11): a shutdown release is routed like every other
// recovery. An effect interrupted on its last attempt is dead-lettered, not
// given a MaxAttempts+1st delivery; a started one goes to reconciliation;
// any other goes back to available at once.
func TestReleaseRoutesLikeRecovery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		maxAttempts int
		start       bool
		want        string
	}{
		{"attempts-left", 2, false, "available"},
		{"last-attempt", 1, false, "dead_letter"},
		{"started", 2, true, "reconciliation_required"},
		{"started-last-attempt", 1, true, "reconciliation_required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			id := f.insertOne(t, "k", tc.maxAttempts)
			c := f.claimOne(t)
			fence := c.Fence()
			if tc.start {
				if ok, err := MarkStarted(f.ctx, f.pool, fence); err != nil || !ok {
					t.Fatalf("start: %v %v", ok, err)
				}
			}
			state, found, err := Fail(f.ctx, f.pool, fence, FailRelease, 0, "worker shutting down")
			if err != nil || !found {
				t.Fatalf("release: found=%v, %v", found, err)
			}
			got := f.get(t, id)
			if state != tc.want || got.State != tc.want {
				t.Fatalf("release of attempt %d/%d (started %v): returned %s, row %s; want %s",
					got.Attempts, tc.maxAttempts, tc.start, state, got.State, tc.want)
			}
			if tc.want == "available" {
				// And it is claimable at once (release adds no delay).
				if again, err := Claim(f.ctx, f.pool, "q", "w2", 1, time.Minute); err != nil || len(again) != 1 {
					t.Fatalf("reclaim after release: %d effects, %v", len(again), err)
				}
			}
		})
	}
}

// Defect 7 (issue #11): a row-lock lease promoted to a durable lease gets a
// whole LeaseDuration from the promotion, not from the start of the claim
// transaction that held the rows meanwhile.
func TestPromotedLeaseIsWhole(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.insertOne(t, "k", 8)
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	locked, err := LockClaim(f.ctx, tx, "q", 1, time.Minute)
	if err != nil || len(locked) != 1 {
		t.Fatalf("lock claim: %d, %v", len(locked), err)
	}
	// The hold: the claim transaction is older than this instant.
	var before time.Time
	if err := tx.QueryRow(f.ctx, `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	const lease = time.Minute
	if _, _, err := CloseLocked(f.ctx, tx, false, 0, nil, []int64{id}, "w", lease); err != nil {
		t.Fatal(err)
	}
	var expires, claimedAt time.Time
	if err := tx.QueryRow(f.ctx, `SELECT lease_expires_at, leased_at FROM pgoutbox.effects WHERE id = $1`, id).
		Scan(&expires, &claimedAt); err != nil {
		t.Fatal(err)
	}
	if expires.Before(before.Add(lease)) {
		t.Fatalf("promoted lease expires %s after the promotion began, want at least %s (the claim transaction's hold was subtracted)",
			expires.Sub(before), lease)
	}
	if !claimedAt.Before(before) {
		t.Fatalf("leased_at %s, want the claim's time (before %s)", claimedAt, before)
	}
}

// pauseKeySQL installs a test fixture: a session that set
// pgoutbox_test.pause_key waits for the advisory lock pauseKey just before
// it inserts that key row.
const pauseKeySQL = `
CREATE FUNCTION public.pause_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idempotency_key = current_setting('pgoutbox_test.pause_key', true) THEN
        PERFORM pg_advisory_lock(4243);
        PERFORM pg_advisory_unlock(4243);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER pause_key BEFORE INSERT ON pgoutbox.effect_keys
    FOR EACH ROW EXECUTE FUNCTION public.pause_key();`

// Defect 6 (issue #11): two transactions enqueue the same keys in opposite
// orders. The first has written key a and is paused before key b; the
// second is then started. Inserted in input order, the second writes b and
// waits for a, the first then waits for b: a deadlock, and one enqueue
// fails. Inserted in key order, the second waits on a before writing
// anything, and both enqueues succeed with the same effects.
func TestBatchesWithSharedKeysInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, pauseKeySQL)
	holder, err := f.pool.Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Conn().Close(context.Background()); holder.Release() }()
	if _, err := holder.Exec(f.ctx, `SELECT pg_advisory_lock(4243)`); err != nil {
		t.Fatal(err)
	}
	batch := func(keys ...string) []NewEffect {
		out := make([]NewEffect, len(keys))
		for i, k := range keys {
			out[i] = NewEffect{Queue: "q", Type: "t", Key: k, Payload: []byte(`{}`), MaxAttempts: 8}
		}
		return out
	}
	type result struct {
		ins []Inserted
		err error
	}
	begin := func(pauseKey string) (pgx.Tx, uint32) {
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		if _, err := tx.Exec(f.ctx, `SELECT set_config('pgoutbox_test.pause_key', $1, true)`, pauseKey); err != nil {
			t.Fatal(err)
		}
		return tx, tx.Conn().PgConn().PID()
	}
	first, firstPID := begin("b")
	second, secondPID := begin("")
	firstDone, secondDone := make(chan result, 1), make(chan result, 1)
	go func() {
		ins, err := Insert(f.ctx, first, batch("a", "b"))
		firstDone <- result{ins, err}
	}()
	f.waitBlocked(t, firstPID, "the first batch to pause before key b")
	go func() {
		ins, err := Insert(f.ctx, second, batch("b", "a"))
		secondDone <- result{ins, err}
	}()
	f.waitBlocked(t, secondPID, "the second batch to wait for the first")
	if _, err := holder.Exec(f.ctx, `SELECT pg_advisory_unlock(4243)`); err != nil {
		t.Fatal(err)
	}
	r1 := <-firstDone
	if r1.err != nil {
		t.Fatalf("first batch [a b]: %v", r1.err)
	}
	if err := first.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r2 := <-secondDone
	if r2.err != nil {
		t.Fatalf("second batch [b a]: %v", r2.err)
	}
	if err := second.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if !r1.ins[0].Created || !r1.ins[1].Created || r2.ins[0].Created || r2.ins[1].Created ||
		r2.ins[0].ID != r1.ins[1].ID || r2.ins[1].ID != r1.ins[0].ID {
		t.Fatalf("first [a b] %+v, second [b a] %+v: want the second to return the first's effects, creating nothing", r1.ins, r2.ins)
	}
	var effects, keys int64
	if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM pgoutbox.effects), (SELECT count(*) FROM pgoutbox.effect_keys)`).
		Scan(&effects, &keys); err != nil {
		t.Fatal(err)
	}
	if effects != 2 || keys != 2 {
		t.Fatalf("%d effects and %d key rows, want 2 and 2", effects, keys)
	}
}

// A key repeated inside one batch goes to its first occurrence, whatever
// the canonical order of the key rows does with ties.
func TestRepeatedKeyInBatchGoesToFirstOccurrence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ins, err := Insert(f.ctx, f.pool, []NewEffect{
		{Queue: "q", Type: "first", Key: "z", Payload: []byte(`{}`), MaxAttempts: 8},
		{Queue: "q", Type: "t", Key: "a", Payload: []byte(`{}`), MaxAttempts: 8},
		{Queue: "q", Type: "second", Key: "z", Payload: []byte(`{}`), MaxAttempts: 8},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !ins[0].Created || !ins[1].Created || ins[2].Created || ins[2].ID != ins[0].ID {
		t.Fatalf("batch [z a z]: %+v, want the first z created and the second returning it", ins)
	}
	if got := f.get(t, ins[0].ID); got.Type != "first" {
		t.Fatalf("key z holds the effect of type %s, want the first occurrence's", got.Type)
	}
}

// Defect 6 (issue #11), REPEATABLE READ: a key committed by a concurrent
// transaction after this transaction's snapshot cannot be returned (the
// snapshot cannot see it). The enqueue fails with serialization_failure
// (40001), writes nothing, and the retried transaction returns the existing
// effect.
func TestRepeatableReadDuplicateKeyIsASerializationFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	rr, err := f.pool.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rr.Rollback(context.Background()) }()
	if _, err := rr.Exec(f.ctx, `SELECT count(*) FROM pgoutbox.effects`); err != nil { // the snapshot
		t.Fatal(err)
	}
	id := f.insertOne(t, "k", 8) // committed after the snapshot
	_, err = Insert(f.ctx, rr, []NewEffect{{Queue: "q", Type: "t", Key: "k", Payload: []byte(`{}`), MaxAttempts: 8}})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("enqueue of a key committed after the REPEATABLE READ snapshot: %v, want serialization_failure (40001)", err)
	}
	_ = rr.Rollback(f.ctx)
	var again []Inserted
	err = pgx.BeginTxFunc(f.ctx, f.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var err error
		again, err = Insert(f.ctx, tx, []NewEffect{{Queue: "q", Type: "t", Key: "k", Payload: []byte(`{}`), MaxAttempts: 8}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Created || again[0].ID != id {
		t.Fatalf("retried REPEATABLE READ enqueue: %+v, want the existing effect %d", again[0], id)
	}
	var n int64
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d effects (%v), want 1", n, err)
	}
}
