package pgoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// Delivery.LeaseToken names the lease of every delivery, in both lease
// modes (issue 28, point 7): under a durable lease the token the row
// carries; under a row-lock lease, where the row has none, the claim
// transaction's identity (a UUID); from a batch (the batch storage test
// matrix), the batch's lease token. A redelivery has another token.
func TestDeliveryLeaseTokenInBothModes(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			type seen struct{ token, rowToken string }
			var mu sync.Mutex
			got := map[string][]seen{}
			c := b.startClient(t, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: mode.hold}},
				Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
					var row *string
					err := b.pool.QueryRow(ctx, `SELECT lease_token::text FROM pgoutbox.effects WHERE id = $1`, d.ID).Scan(&row)
					if errors.Is(err, pgx.ErrNoRows) {
						// Batch storage (the test matrix): the effect runs
						// from its batch, under the batch's lease.
						err = b.pool.QueryRow(ctx, `SELECT lease_token::text FROM pgoutbox.stream_batches
							WHERE queue = 'q' AND $1 BETWEEN min_id AND max_id`, d.ID).Scan(&row)
					}
					if err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					s := seen{token: d.LeaseToken}
					if row != nil {
						s.rowToken = *row
					}
					got[d.Key] = append(got[d.Key], s)
					if d.Key == "again" && len(got[d.Key]) == 1 {
						return pgoutbox.Retry(errors.New("503"))
					}
					return nil
				}}},
			})
			w := watch(t, c)
			ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "once"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "again"})
			b.waitEvent(t, w, ids[0], "completed")
			b.waitEvent(t, w, ids[1], "completed")
			mu.Lock()
			defer mu.Unlock()
			for key, ds := range got {
				for i, d := range ds {
					if _, err := uuid.Parse(d.token); err != nil {
						t.Errorf("%s, delivery %d: LeaseToken %q is no UUID: %v", key, i+1, d.token, err)
					}
					if d.rowToken != "" && d.rowToken != d.token {
						t.Errorf("%s, delivery %d: LeaseToken %q, the row's lease token %q", key, i+1, d.token, d.rowToken)
					}
				}
			}
			if a := got["again"]; len(a) != 2 || a[0].token == a[1].token {
				t.Errorf("the redelivery's lease token: %+v, want two deliveries with different tokens", a)
			}
		})
	}
}

// One Client, two deliveries of one effect (issue 28, point 5): requeue-stale
// takes the lease of a delivery in flight and the same Client claims the
// effect again. The stale delivery is cancelled as lease-lost by the next
// extension, the fresh one keeps being extended after the stale one's
// cleanup, and the effect completes once, by the fresh delivery. Durable
// leases only: requeue-stale takes leased effects, and a row-lock delivery
// holds none until it is promoted.
func TestRequeuedLeaseReclaimedBySameClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started := make(chan context.Context, 2)
	release := make(chan struct{})
	var calls sync.WaitGroup
	calls.Add(1) // the stale delivery's handler
	c := b.startClient(t, pgoutbox.Config{
		LeaseDuration: time.Hour, PollInterval: 20 * time.Millisecond,
		// Row storage whatever the test matrix says: requeue-stale takes
		// a durable lease row back.
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2, RowLockLease: pgoutbox.RowLockLeaseOff,
			Storage: pgoutbox.StorageRows}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			started <- ctx
			if d.Attempt == 1 {
				defer calls.Done()
				<-ctx.Done()
				return ctx.Err()
			}
			<-release
			return nil
		}}},
	})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	t.Cleanup(done) // before the Client's stop
	w := watch(t, c)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	stale := <-started
	if res, err := ops.RequeueStale(b.ctx, b.pool, ops.RequeueOptions{StalledAfter: time.Nanosecond}); err != nil || len(res.Requeued) != 1 {
		t.Fatalf("requeue-stale: %v (%+v)", err, res)
	}
	fresh := <-started
	c.ExtendLeasesNow(b.ctx)
	b.waitFor(t, "the stale delivery cancelled", func() bool { return stale.Err() != nil })
	if cause := context.Cause(stale); !errors.Is(cause, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale delivery cancelled with %v, want the lost lease", cause)
	}
	calls.Wait()
	b.waitEvent(t, w, id, "") // the stale delivery reported its lost lease
	expiry := func() time.Time {
		var at time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT lease_expires_at FROM pgoutbox.effects WHERE id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := expiry()
	c.ExtendLeasesNow(b.ctx)
	if after := expiry(); !after.After(before) {
		t.Fatalf("the fresh lease was not extended after the stale delivery's cleanup (%s, then %s)", before, after)
	}
	if fresh.Err() != nil {
		t.Fatalf("fresh delivery cancelled: %v", context.Cause(fresh))
	}
	done()
	b.waitEvent(t, w, id, "completed")
	if r := b.row(t, id); r.State != "completed" || r.Attempts != 2 {
		t.Fatalf("effect after both deliveries: %+v, want completed at attempt 2", r)
	}
}
