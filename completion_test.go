package pgoutbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// TestFailedTransitionGoesToReconciliationAtOnce: a non-replay-safe effect
// whose delivery succeeded but whose completion transition (OnComplete)
// failed is moved to reconciliation_required by the worker itself, with the
// transition's error, while its lease (an hour) is still far from expiring.
func TestFailedTransitionGoesToReconciliationAtOnce(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var calls atomic.Int64
			c := b.startClient(t, pgoutbox.Config{
				LeaseDuration: time.Hour,
				Queues:        map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2, RowLockLease: mode.hold}},
				Types: []pgoutbox.EffectType{{Name: "dispatch", ReplaySafe: false,
					Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
						calls.Add(1)
						d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
							return errors.New("duplicate run id")
						})
						return nil
					}}},
			})
			w := watch(t, c)
			ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "k1", Payload: []byte(`{}`)})
			e := b.waitEvent(t, w, ids[0], "reconciliation_required")
			if e.Outcome != pgoutbox.OutcomeAmbiguous {
				t.Errorf("outcome %s, want ambiguous", e.Outcome)
			}
			r := b.row(t, ids[0])
			if n := calls.Load(); n != 1 {
				t.Fatalf("dispatch sent %d times", n)
			}
			if r.State != "reconciliation_required" || r.Token != nil || r.Started == nil || r.LastError == nil ||
				!strings.Contains(*r.LastError, "completion transition failed: completion transition: duplicate run id") {
				t.Fatalf("row %+v, last_error %v", r, deref(r.LastError))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
