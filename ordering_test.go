package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// A strict dead letter holds its key back until it is replayed (and then
// goes first); a move-on type's dead letter lets the key move on. Other keys
// and unordered effects are never held back. Both lease modes.
func TestOrderedDeadLetterStrictAndMoveOn(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var mu sync.Mutex
			var order []string
			poisoned := map[string]bool{"strict-1": true, "moveon-1": true}
			h := func(_ context.Context, d *pgoutbox.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				if want := map[string]string{"strict": "A", "moveon": "B", "other": "C", "free": ""}[strings.SplitN(d.Key, "-", 2)[0]]; d.OrderingKey != want {
					order = append(order, "bad ordering key "+d.OrderingKey)
				}
				if poisoned[d.Key] {
					delete(poisoned, d.Key) // fails once, succeeds when replayed
					return pgoutbox.Permanent(errors.New("422"))
				}
				order = append(order, d.Key)
				return nil
			}
			c := b.startClient(t, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4, RowLockLease: mode.hold}},
				Types: []pgoutbox.EffectType{
					{Name: "strict", ReplaySafe: true, Handler: h},
					{Name: "moveon", ReplaySafe: true, Handler: h, OrderingMovesOn: true},
				},
			})
			w := watch(t, c)
			ids := map[string]int64{}
			for _, e := range []pgoutbox.Effect{
				{Queue: "q", Type: "strict", Key: "strict-1", OrderingKey: "A"},
				{Queue: "q", Type: "strict", Key: "strict-2", OrderingKey: "A"},
				{Queue: "q", Type: "moveon", Key: "moveon-1", OrderingKey: "B"},
				{Queue: "q", Type: "strict", Key: "moveon-2", OrderingKey: "B"},
			} {
				ids[e.Key] = b.enqueue(t, e)[0] // one transaction each: commit order is enqueue order
			}
			b.waitEvent(t, w, ids["strict-1"], "dead_letter")
			b.waitEvent(t, w, ids["moveon-1"], "dead_letter")
			b.waitEvent(t, w, ids["moveon-2"], "completed") // B moved on
			// Proof that claims ran after the dead letter and skipped
			// strict-2: an unordered effect and another key enqueued now
			// are delivered, and strict-2 still waits.
			later := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "strict", Key: "free"},
				pgoutbox.Effect{Queue: "q", Type: "strict", Key: "other", OrderingKey: "C"})
			b.waitEvent(t, w, later[0], "completed")
			b.waitEvent(t, w, later[1], "completed")
			if r := b.row(t, ids["strict-2"]); r.State != "available" || r.Attempts != 0 {
				t.Fatalf("strict-2 behind a strict dead letter: %+v, want available, never attempted", r)
			}
			// Replaying the dead letter unblocks the key: it is delivered
			// first, then strict-2.
			if _, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{IDs: []int64{ids["strict-1"]}}); err != nil {
				t.Fatal(err)
			}
			b.waitEvent(t, w, ids["strict-2"], "completed")
			mu.Lock()
			defer mu.Unlock()
			// free and other (two keys) may go in either order.
			got := fmt.Sprint(order)
			if got != "[moveon-2 free other strict-1 strict-2]" && got != "[moveon-2 other free strict-1 strict-2]" {
				t.Fatalf("delivered %s, want moveon-2, free and other, then strict-1, strict-2", got)
			}
		})
	}
}

// The key's next effect is claimed when the previous one completes, not at
// the next poll: with a poll interval of an hour and handlers slower than
// the active tail, only the notification of the completion (migration
// 00013's trigger) wakes the claim loop.
func TestOrderedCompletionWakesClaims(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startClient(t, pgoutbox.Config{
		PollInterval: time.Hour,
		Queues:       map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2}},
		Types: []pgoutbox.EffectType{{Name: "slow", ReplaySafe: true, Handler: func(ctx context.Context, _ *pgoutbox.Delivery) error {
			select { // longer than ActiveTail, so the loop has gone idle
			case <-time.After(2 * pgoutbox.ActiveTail):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}}},
	})
	w := watch(t, c)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "slow", Key: "1", OrderingKey: "k"},
		pgoutbox.Effect{Queue: "q", Type: "slow", Key: "2", OrderingKey: "k"},
		pgoutbox.Effect{Queue: "q", Type: "slow", Key: "3", OrderingKey: "k"},
	)
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
}
