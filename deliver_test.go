package pgoutbox_test

import (
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// TestLeaseDeliver: a lease claimed outside a Client is delivered with the
// engine's rules: a success completes it (with its OnComplete transition,
// in a group commit), a retry is scheduled, a permanent error
// dead-letters, an ambiguous error of a type that is not replay-safe goes
// to reconciliation_required (its start committed before the handler
// ran), and a lost lease writes nothing.
func TestLeaseDeliver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "ok"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "retry"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "permanent"},
		pgoutbox.Effect{Queue: "q", Type: "unsafe", Key: "ambiguous"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "lost"},
	)
	var started bool
	types := map[string]pgoutbox.EffectType{
		"t": {Name: "t", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			switch d.Key {
			case "retry":
				return pgoutbox.Retry(errors.New("503"))
			case "permanent":
				return pgoutbox.Permanent(errors.New("400"))
			case "ok":
				d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `CREATE TABLE delivered_ok (id int)`)
					return err
				})
			}
			return nil
		}},
		"unsafe": {Name: "unsafe", Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			started = b.row(t, d.ID).Started != nil
			return pgoutbox.Ambiguous(errors.New("timeout after sending"))
		}},
	}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "manual", 10, time.Minute)
	if err != nil || len(leases) != len(ids) {
		t.Fatalf("claim: %v (%d)", err, len(leases))
	}
	sort.Slice(leases, func(i, j int) bool { return leases[i].ID < leases[j].ID })
	comp := pgoutbox.NewCompleter(b.pool, 0)
	opts := pgoutbox.DeliverOptions{Completer: comp, BackoffCap: time.Minute}
	want := []struct {
		outcome pgoutbox.Outcome
		state   pgoutbox.State
	}{
		{pgoutbox.OutcomeSuccess, pgoutbox.StateCompleted},
		{pgoutbox.OutcomeRetry, pgoutbox.StateAvailable},
		{pgoutbox.OutcomePermanent, pgoutbox.StateDeadLetter},
		{pgoutbox.OutcomeAmbiguous, pgoutbox.StateReconciliationRequired},
	}
	for i, w := range want {
		l := leases[i]
		r, err := l.Deliver(b.ctx, b.pool, types[l.Type], opts)
		if err != nil || r.Outcome != w.outcome || r.State != w.state {
			t.Errorf("%s: %+v %v, want %s → %s", l.Key, r, err, w.outcome, w.state)
		}
		if row := b.row(t, l.ID); row.State != string(w.state) {
			t.Errorf("%s: row %+v, want %s", l.Key, row, w.state)
		}
	}
	comp.Close()
	if !started {
		t.Error("the start of a non-replay-safe delivery was not committed before its handler ran")
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM delivered_ok`).Scan(&n); err != nil {
		t.Errorf("the OnComplete transition did not commit with the completion: %v", err)
	}
	// A lost lease: recovered by a sweeper before the outcome is written.
	lost := leases[4]
	expire(t, b, lost.ID)
	if n, err := newSweeper(t, b).Sweep(b.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	before := b.rowJSON(t, lost.ID)
	if _, err := lost.Deliver(b.ctx, b.pool, types["t"], pgoutbox.DeliverOptions{}); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("lost lease: %v, want ErrLeaseLost", err)
	}
	if after := b.rowJSON(t, lost.ID); after != before {
		t.Fatalf("a lost lease's delivery changed the row:\n%s\n%s", before, after)
	}
	// A type other than the lease's is refused before anything runs.
	if _, err := lost.Deliver(b.ctx, b.pool, types["unsafe"], pgoutbox.DeliverOptions{}); err == nil || errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("delivering with another type: %v", err)
	}
}

// TestLeaseDeliverHandBack: DeliverOptions.HandBack records a retry
// instead of Deliver (a broker consumer hands it back to its broker); it
// is not offered a dead letter unless it accepts it, and Deliver records
// what it declines.
func TestLeaseDeliverHandBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "b"})
	typ := pgoutbox.EffectType{Name: "t", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
		if d.Key == "a" {
			return pgoutbox.Retry(errors.New("503"))
		}
		return pgoutbox.Permanent(errors.New("400"))
	}}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "consumer", 2, time.Minute)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim: %v", err)
	}
	var offered []pgoutbox.Failure
	opts := pgoutbox.DeliverOptions{HandBack: func(ctx context.Context, f pgoutbox.Failure) (bool, error) {
		offered = append(offered, f)
		if !f.Retry {
			return false, nil
		}
		return true, nil // the broker redelivers; nothing written here
	}}
	for _, l := range leases {
		before := b.row(t, l.ID)
		r, err := l.Deliver(b.ctx, b.pool, typ, opts)
		if err != nil {
			t.Fatalf("%s: %v", l.Key, err)
		}
		switch l.Key {
		case "a":
			if !r.HandedBack || r.State != pgoutbox.StateLeased || b.row(t, l.ID).State != before.State {
				t.Errorf("retry: %+v, row %+v: want handed back, the row unchanged", r, b.row(t, l.ID))
			}
		case "b":
			if r.HandedBack || r.State != pgoutbox.StateDeadLetter {
				t.Errorf("permanent: %+v, want dead-lettered by Deliver", r)
			}
		}
	}
	if len(offered) != 2 || !offered[0].Retry || offered[0].Delay <= 0 || offered[1].Retry {
		t.Fatalf("offered %+v", offered)
	}
}

// TestLeaseKeeper: held leases are extended in one statement; one lost in
// the meantime has its delivery cancelled with ErrLeaseLost.
func TestLeaseKeeper(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "kept"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "lost"})
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "keeper", 2, time.Minute)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim: %v", err)
	}
	k := pgoutbox.NewLeaseKeeper(b.pool, time.Hour, nil)
	ctxs := map[string]context.Context{}
	kept := map[string]int{}
	for _, l := range leases {
		ctx, cancel := context.WithCancelCause(b.ctx)
		defer cancel(nil)
		ctxs[l.Key] = ctx
		k.Hold(l, cancel, func() { kept[l.Key]++ })
	}
	expire(t, b, ids[1])
	if n, err := newSweeper(t, b).Sweep(b.ctx); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	k.ExtendNow(b.ctx)
	if kept["kept"] != 1 || kept["lost"] != 0 || ctxs["kept"].Err() != nil || !errors.Is(context.Cause(ctxs["lost"]), pgoutbox.ErrLeaseLost) {
		t.Fatalf("kept %v, kept ctx %v, lost cause %v", kept, ctxs["kept"].Err(), context.Cause(ctxs["lost"]))
	}
	var mins float64
	if err := b.pool.QueryRow(b.ctx, `SELECT extract(epoch FROM lease_expires_at - now()) / 60 FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&mins); err != nil || mins < 50 {
		t.Fatalf("the kept lease expires in %.1f min (%v), want about an hour", mins, err)
	}
	for _, l := range leases {
		k.Drop(l)
	}
	k.ExtendNow(b.ctx) // nothing held: no statement, no call
	if kept["kept"] != 1 {
		t.Fatalf("a dropped lease was extended: %v", kept)
	}
}

// TestQueueBacklogAndKeysPastAvailable: the backlog counts what is still
// to deliver; KeysPastAvailable names the keys whose effect left available.
func TestQueueBacklogAndKeysPastAvailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "b"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "later", AvailableAt: time.Now().Add(time.Hour)})
	claimed := claimOne(t, b, "w")
	bl, err := pgoutbox.QueueBacklog(b.ctx, b.pool, "q")
	if err != nil || bl != (pgoutbox.Backlog{Available: 2, Ready: 1, Leased: 1}) {
		t.Fatalf("backlog %+v %v", bl, err)
	}
	keys, err := pgoutbox.KeysPastAvailable(b.ctx, b.pool, "q", []string{"a", "b", "later", "none"})
	if err != nil || len(keys) != 1 || keys[0] != claimed.Key {
		t.Fatalf("keys past available: %v %v, want [%s]", keys, err, claimed.Key)
	}
}
