package pgoutbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox"
)

// Delivery.LeaseToken names the lease of every delivery, in both lease
// modes (issue 28, point 7): under a durable lease the token the row
// carries; under a row-lock lease, where the row has none, the claim
// transaction's identity (a UUID). A redelivery has another token.
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
					if err := b.pool.QueryRow(ctx, `SELECT lease_token::text FROM pgoutbox.effects WHERE id = $1`, d.ID).Scan(&row); err != nil {
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
