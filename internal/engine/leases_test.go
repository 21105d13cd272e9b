package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// twoDeliveries claims effect id, takes that live lease away as
// `pgoutbox requeue-stale` does and claims the effect again: the stale
// fence and the fresh one of one effect, as one Client holds them when it
// re-claims its own stalled effect.
func twoDeliveries(t *testing.T, ctx context.Context, pool *pgxpool.Pool, id int64) (stale, fresh store.Fence) {
	t.Helper()
	claim := func() store.Fence {
		t.Helper()
		cl, err := store.Claim(ctx, pool, "q", "w", 1, time.Minute)
		if err != nil || len(cl) != 1 || cl[0].ID != id {
			t.Fatalf("claim: %v (%d)", err, len(cl))
		}
		return cl[0].Fence()
	}
	stale = claim()
	if m, err := store.RequeueStale(ctx, pool, 0, store.OpsFilter{Queue: "q"}, 10); err != nil || len(m) != 1 {
		t.Fatalf("requeue-stale: %v (%d)", err, len(m))
	}
	fresh = claim()
	if stale.Token == fresh.Token {
		t.Fatal("the re-claim kept the token")
	}
	return stale, fresh
}

// cancelRecorder is a delivery's cancel function that records its cause.
type cancelRecorder struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newCancelRecorder() *cancelRecorder {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &cancelRecorder{ctx: ctx, cancel: cancel}
}

// One Client, two deliveries of one effect (issue 28, point 5): after
// requeue-stale took a live lease and the same Client re-claimed the
// effect, both deliveries are registered. The extender must cancel the
// stale one as lease-lost and keep extending the fresh one, also after the
// stale delivery's cleanup forgot its own lease.
func TestLeasesKeepTwoDeliveriesOfOneEffect(t *testing.T) {
	t.Parallel()
	pool, ctx := setup(t)
	id := enqueue(t, ctx, pool, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	stale, fresh := twoDeliveries(t, ctx, pool, id)

	lost := errors.New("lease lost")
	var leases engine.Leases
	staleRec, freshRec := newCancelRecorder(), newCancelRecorder()
	leases.Put(&engine.Held{Fence: stale, Cancel: staleRec.cancel})
	leases.Put(&engine.Held{Fence: fresh, Cancel: freshRec.cancel})
	ext := engine.Extender{DB: pool, Leases: &leases, Lease: time.Hour, LostCause: lost, Log: slog.New(slog.DiscardHandler)}
	ext.ExtendNow(ctx)
	if cause := context.Cause(staleRec.ctx); !errors.Is(cause, lost) {
		t.Fatalf("stale delivery: cancellation cause %v, want the lost lease", cause)
	}
	if cause := context.Cause(freshRec.ctx); cause != nil {
		t.Fatalf("fresh delivery cancelled: %v", cause)
	}
	// The stale delivery's cleanup forgets its lease, not the fresh one's.
	leases.Delete(stale)
	ext.Lease = 48 * time.Hour
	ext.ExtendNow(ctx)
	if n := pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pgoutbox.effects
		WHERE id = $1 AND lease_token = $2 AND lease_expires_at > now() + interval '24 hours'`, id, fresh.Token); n != 1 {
		t.Fatal("the fresh lease was not extended after the stale delivery's cleanup")
	}
	if cause := context.Cause(freshRec.ctx); cause != nil {
		t.Fatalf("fresh delivery cancelled: %v", cause)
	}
}

// The group committer must report a completion per fence: when the stale
// and the fresh fence of one effect are in one group commit, the fresh one
// completes the effect and the stale one lost its lease.
func TestCommitterReportsTheFenceThatCompleted(t *testing.T) {
	t.Parallel()
	pool, ctx := setup(t)
	ids := enqueue(t, ctx, pool,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"},
		pgoutbox.Effect{Queue: "other", Type: "t", Key: "gate"})
	stale, fresh := twoDeliveries(t, ctx, pool, ids[0])
	gate, err := store.Claim(ctx, pool, "other", "w", 1, time.Minute)
	if err != nil || len(gate) != 1 {
		t.Fatalf("claim the gate: %v (%d)", err, len(gate))
	}

	// The only worker waits on the gate's row lock while both fences queue
	// up behind it: they are then committed in one batch.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM pgoutbox.effects WHERE id = $1 FOR UPDATE`, ids[1]); err != nil {
		t.Fatal(err)
	}
	c := engine.StartCommitter(pool, 10, 1)
	defer c.Close()
	results := make(chan engine.Committed, 3)
	go func() { results <- c.Complete(gate[0].Fence()) }()
	pgtest.WaitFor(t, ctx, "the group commit to wait on the gate's lock", func() bool {
		return pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 1
	})
	got := make(map[store.Fence]chan engine.Committed, 2)
	for _, f := range []store.Fence{stale, fresh} {
		ch := make(chan engine.Committed, 1)
		got[f] = ch
		go func() { ch <- c.Complete(f) }()
	}
	pgtest.WaitFor(t, ctx, "both fences to be queued", func() bool { return c.Queued() == 2 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-results; !r.OK || r.Err != nil {
		t.Fatalf("gate: %+v", r)
	}
	if r := <-got[fresh]; !r.OK || r.Err != nil {
		t.Fatalf("fresh fence: %+v, want completed", r)
	}
	if r := <-got[stale]; r.OK || r.Err != nil {
		t.Fatalf("stale fence: %+v, want its lease lost", r)
	}
}
