package pgoutbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// expire moves an effect's lease into the past (what waiting out the lease
// would do, without waiting).
func expire(t *testing.T, b *bundle, ids ...int64) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second'
		WHERE id = ANY($1) AND state = 'leased'`, ids); err != nil {
		t.Fatal(err)
	}
}

func claimOne(t *testing.T, b *bundle, owner string) *pgoutbox.Lease {
	t.Helper()
	ls, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", owner, 1, time.Minute)
	if err != nil || len(ls) != 1 {
		t.Fatalf("claim: %v (%d)", err, len(ls))
	}
	return ls[0]
}

func newSweeper(t *testing.T, b *bundle) *pgoutbox.Client {
	t.Helper()
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFencingAfterRecoveryAndReclaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	stale := claimOne(t, b, "worker-a")
	expire(t, b, id)
	if n, err := newSweeper(t, b).Sweep(b.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	fresh := claimOne(t, b, "worker-b")
	if fresh.ID != id || fresh.LeaseToken == stale.LeaseToken || fresh.Attempt != 2 {
		t.Fatalf("reclaim: %+v", fresh.Delivery)
	}
	before := b.rowJSON(t, id)
	if err := stale.Complete(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale complete: %v", err)
	}
	if _, err := stale.Fail(b.ctx, b.pool, errors.New("x"), true, time.Second); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale fail: %v", err)
	}
	if err := stale.Extend(b.ctx, b.pool, time.Hour); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale extend: %v", err)
	}
	if err := stale.MarkStarted(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale mark started: %v", err)
	}
	if after := b.rowJSON(t, id); after != before {
		t.Fatalf("a stale worker changed the row:\n%s\n%s", before, after)
	}
	if err := fresh.Extend(b.ctx, b.pool, time.Hour); err != nil {
		t.Fatalf("live extend: %v", err)
	}
	if err := fresh.Complete(b.ctx, b.pool); err != nil {
		t.Fatalf("live complete: %v", err)
	}
	if r := b.row(t, id); r.State != "completed" {
		t.Fatalf("state %s", r.State)
	}
	if err := fresh.Complete(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("second complete: %v, want ErrLeaseLost", err)
	}
}

func TestFenceChecksEffectType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	l := claimOne(t, b, "w")
	// Retype the row behind the worker's back: its fence must no longer match.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET effect_type = 'other' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("complete with the wrong type: %v", err)
	}
	if r := b.row(t, id); r.State != "leased" {
		t.Fatalf("state %s, want leased", r.State)
	}
}

func TestSweeperRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "safe"},
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "started"},
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "not-started"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "exhausted", MaxAttempts: 1},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "live"},
	)
	ls, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "w", 5, time.Minute)
	if err != nil || len(ls) != 5 {
		t.Fatalf("claim %d %v", len(ls), err)
	}
	byID := map[int64]*pgoutbox.Lease{}
	for _, l := range ls {
		byID[l.ID] = l
	}
	if err := byID[ids[1]].MarkStarted(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	expire(t, b, ids[:4]...)
	n, err := newSweeper(t, b).Sweep(b.ctx)
	if err != nil || n != 4 {
		t.Fatalf("swept %d (%v), want 4", n, err)
	}
	want := []string{"available", "reconciliation_required", "available", "dead_letter", "leased"}
	for i, id := range ids {
		if r := b.row(t, id); r.State != want[i] {
			t.Errorf("effect %d: %s, want %s", i, r.State, want[i])
		}
	}
	if r := b.row(t, ids[0]); r.AvailableIn > 0.5 || r.Token != nil {
		t.Errorf("rescued effect not immediately available: %+v", r)
	}
}

func TestTwoSweepersRescueEachEffectOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var effects []pgoutbox.Effect
	for i := range 2000 {
		effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "t", Key: strconv.Itoa(i)})
	}
	b.enqueue(t, effects...)
	if _, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "dead", 2000, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 s'`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	counts := make([]int, 2)
	for i := range 2 {
		s := newSweeper(t, b)
		wg.Go(func() {
			n, err := s.Sweep(b.ctx)
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	if counts[0]+counts[1] != 2000 {
		t.Fatalf("rescued %v, want 2000 in total", counts)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available'`); n != 2000 {
		t.Fatalf("%d available, want 2000", n)
	}
}

func TestPruneKeepsDeadLettersAndReconciliation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var effects []pgoutbox.Effect
	for i := range 2500 {
		effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "t", Key: strconv.Itoa(i)})
	}
	b.enqueue(t, effects...)
	if _, err := b.pool.Exec(b.ctx, `
		UPDATE pgoutbox.effects SET
		  state = CASE WHEN id % 10 = 0 THEN 'dead_letter' WHEN id % 10 = 1 THEN 'reconciliation_required' ELSE 'completed' END::pgoutbox.effect_state,
		  completed_at = CASE WHEN id % 10 > 1 THEN now() - CASE WHEN id % 2 = 0 THEN interval '25 hours' ELSE interval '1 hour' END END,
		  dead_lettered_at = now() - interval '30 days'`); err != nil {
		t.Fatal(err)
	}
	oldCompleted := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND completed_at < now() - interval '24 hours'`)
	before := b.count(t)
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{PruneBatch: 100})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Prune(b.ctx)
	if err != nil || n != oldCompleted {
		t.Fatalf("pruned %d (%v), want %d", n, err, oldCompleted)
	}
	if after := b.count(t); after != before-oldCompleted {
		t.Fatalf("rows %d → %d", before, after)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state IN ('dead_letter','reconciliation_required')`); n != 500 {
		t.Fatalf("%d dead letters + reconciliation records, want 500 (never pruned)", n)
	}
}

func TestLeaseExtensionKeepsLongDeliveriesAndCancelsLostOnes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan int64, 2)
	causes := make(chan error, 2)
	release := make(chan struct{})
	c := b.startClient(t, pgoutbox.Config{
		// Row storage whatever the test matrix says: the leases this test
		// shortens and steals are rows from the claim on.
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2, DeliveryTimeout: 50 * time.Second,
			Storage: pgoutbox.StorageRows}},
		LeaseDuration: time.Minute,
		SweepInterval: -1,
		Types: []pgoutbox.EffectType{{Name: "long", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			started <- d.ID
			select {
			case <-ctx.Done():
				causes <- context.Cause(ctx)
				return ctx.Err()
			case <-release:
				return nil
			}
		}}},
	})
	defer close(release)
	events := watch(t, c)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "long", Key: "kept"}, pgoutbox.Effect{Queue: "q", Type: "long", Key: "lost"})
	<-started
	<-started
	// Shorten both leases, then steal the second one: expire, sweep, re-claim.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() + interval '5 seconds' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	expire(t, b, ids[1])
	if n, err := newSweeper(t, b).Sweep(b.ctx); err != nil || n != 1 {
		t.Fatalf("sweep %d %v", n, err)
	}
	thief, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "thief", 1, time.Minute)
	if err != nil || len(thief) != 1 || thief[0].ID != ids[1] {
		t.Fatalf("steal: %v %v", thief, err)
	}
	c.ExtendLeasesNow(b.ctx)
	var left float64
	if err := b.pool.QueryRow(b.ctx, `SELECT extract(epoch FROM lease_expires_at - now()) FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < 50 {
		t.Fatalf("lease of the live delivery has %.0fs left after extension, want ~60s", left)
	}
	if cause := <-causes; !errors.Is(cause, pgoutbox.ErrLeaseLost) {
		t.Fatalf("the stolen delivery was cancelled with %v, want ErrLeaseLost", cause)
	}
	b.waitEvent(t, events, ids[1], "")
	if r := b.row(t, ids[1]); r.State != "leased" || r.Token == nil || *r.Token != thief[0].LeaseToken {
		t.Fatalf("the thief's lease was disturbed: %+v", r)
	}
}

// A slow internal job holds its row lock (the fenced completion) while its
// TxHandler runs. The lease extension must not wait for that transaction:
// it extends every other lease at once and leaves the job's row, which its
// own transaction protects, to the next round; and another effect's
// completion proceeds while the job is still running. The blocked job's
// effect has the higher id, so an extension locking in id order takes the
// other effect's row first (and, waiting, would also hold up its group
// commit).
func TestSlowJobStallsNoOtherLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan string, 2)
	safeGo, jobGo := make(chan struct{}), make(chan struct{})
	var jobReturned atomic.Bool
	var jobCause atomic.Value
	c := b.startClient(t, pgoutbox.Config{
		Queues:        map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2}},
		LeaseDuration: time.Hour, // no periodic extension during the test
		SweepInterval: -1,
		Types: []pgoutbox.EffectType{
			{Name: "safe", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				started <- "safe"
				select {
				case <-safeGo:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}},
			{Name: "job", TxHandler: func(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
				defer jobReturned.Store(true)
				started <- "job"
				select {
				case <-jobGo:
					return nil
				case <-ctx.Done():
					jobCause.Store(context.Cause(ctx))
					return ctx.Err()
				}
			}},
		},
	})
	var safeOnce, jobOnce sync.Once
	openSafe := func() { safeOnce.Do(func() { close(safeGo) }) }
	openJob := func() { jobOnce.Do(func() { close(jobGo) }) }
	t.Cleanup(openSafe) // before the client's Stop (cleanups run last-in first-out)
	t.Cleanup(openJob)
	events := watch(t, c)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "other"}, pgoutbox.Effect{Queue: "q", Type: "job", Key: "slow"})
	<-started
	<-started
	expiry := func(id int64) time.Time {
		var at time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT lease_expires_at FROM pgoutbox.effects WHERE id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := expiry(ids[0])
	// Bounded so that a regression fails here instead of hanging the test.
	ectx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	c.ExtendLeasesNow(ectx)
	cancel()
	if after := expiry(ids[0]); !after.After(before) {
		t.Fatalf("the other lease was not extended (%s → %s): the extension waited for the job's transaction", before, after)
	}
	openSafe()
	b.waitEvent(t, events, ids[0], "completed")
	if jobReturned.Load() {
		t.Fatalf("the job returned before the other effect completed (cause %v)", jobCause.Load())
	}
	openJob()
	b.waitEvent(t, events, ids[1], "completed")
}
