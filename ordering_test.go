package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// A replayed move-on dead letter is delivered after the effect of its key
// that overtook it and is still in delivery, never beside it: A (move-on)
// dead-letters, B (strict, same key) starts a handler that blocks, A is
// replayed; a claim that runs meanwhile (an unordered effect enqueued
// afterwards is delivered) does not deliver A, and A starts only after B's
// handler returned. Under a row lock B's delivery holds no durable lease
// (the hold outlasts the test), so the replay itself waits for B's claim
// transaction to end; under durable leases the claim skips A while B is
// leased. In batch storage B runs from a batch page, with no row until the
// page settles: the claim skips A while that page is in flight (its
// replay barrier), then while B, promoted after PageHold, is leased.
func TestReplayedMoveOnWaitsForOvertakingDelivery(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			hold := mode.hold
			if hold > 0 {
				hold = 5 * time.Minute // B stays under its row lock until it returns
			}
			var mu sync.Mutex
			var order []string
			note := func(s string) {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, s)
			}
			bStarted, bRelease := make(chan struct{}), make(chan struct{})
			var releaseOnce sync.Once
			releaseB := func() { releaseOnce.Do(func() { close(bRelease) }) }
			aStarted := make(chan struct{}, 1)
			failedOnce := false
			c := b.startClient(t, pgoutbox.Config{
				LeaseDuration: time.Hour,
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4, RowLockLease: hold,
					DeliveryTimeout: 10 * time.Minute}},
				Types: []pgoutbox.EffectType{
					{Name: "moveon", ReplaySafe: true, OrderingMovesOn: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
						mu.Lock()
						first := !failedOnce
						failedOnce = true
						mu.Unlock()
						if first {
							return pgoutbox.Permanent(errors.New("422"))
						}
						note("A start")
						aStarted <- struct{}{}
						return nil
					}},
					{Name: "strict", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
						if d.Key != "B" {
							return nil
						}
						note("B start")
						close(bStarted)
						select {
						case <-bRelease:
						case <-ctx.Done():
							return ctx.Err()
						}
						note("B end")
						return nil
					}},
				},
			})
			t.Cleanup(releaseB) // before the Client's Stop: cleanups run last first
			w := watch(t, c)
			a := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "moveon", Key: "A", OrderingKey: "k"})[0]
			b.waitEvent(t, w, a, "dead_letter")
			bID := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "strict", Key: "B", OrderingKey: "k"})[0]
			select {
			case <-bStarted:
			case <-b.ctx.Done():
				t.Fatal("B never started")
			}
			replayed := make(chan error, 1)
			go func() {
				_, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{IDs: []int64{a}})
				replayed <- err
			}()
			// The replay has committed, or waits for a lock (B's row lock).
			var replayErr error
			done := false
			b.waitFor(t, "the replay to commit or wait", func() bool {
				select {
				case replayErr = <-replayed:
					done = true
					return true
				default:
				}
				return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND wait_event_type = 'Lock' AND query LIKE '%replay_dead_letters%'`) > 0
			})
			if replayErr != nil {
				t.Fatal(replayErr)
			}
			// A claim after the replay: the unordered effect enqueued now
			// is delivered; A, due before it, is not.
			free := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "strict", Key: "free"})[0]
			b.waitEvent(t, w, free, "completed")
			select {
			case <-aStarted:
				t.Fatalf("the replayed A was delivered while B, of its key, was in delivery (%s)", mode.name)
			default:
			}
			releaseB()
			if !done {
				if err := <-replayed; err != nil {
					t.Fatal(err)
				}
			}
			b.waitEvent(t, w, bID, "completed")
			b.waitEvent(t, w, a, "completed")
			mu.Lock()
			defer mu.Unlock()
			if got := fmt.Sprint(order); got != "[B start B end A start]" {
				t.Fatalf("delivered %s, want B to end before the replayed A starts", got)
			}
		})
	}
}

// The ordering choice is per queue and type (issue 28, point 6): a Client
// of queue qb that registers type t strict, started after the Client of qa
// that registers t move-on, does not turn qa's t strict (the last start won
// for every queue). Both lease modes.
func TestOrderingChoiceIsPerQueue(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := func(_ context.Context, d *pgoutbox.Delivery) error {
				if strings.HasSuffix(d.Key, "-1") {
					return pgoutbox.Permanent(errors.New("422"))
				}
				return nil
			}
			client := func(queue string, movesOn bool) *pgoutbox.Client {
				return b.startClient(t, pgoutbox.Config{
					Queues: map[string]pgoutbox.QueueConfig{queue: {RowLockLease: mode.hold}},
					Types:  []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: h, OrderingMovesOn: movesOn}},
				})
			}
			wa := watch(t, client("qa", true))
			wb := watch(t, client("qb", false))
			ids := map[string]int64{}
			for _, e := range []pgoutbox.Effect{
				{Queue: "qa", Type: "t", Key: "a-1", OrderingKey: "K"},
				{Queue: "qa", Type: "t", Key: "a-2", OrderingKey: "K"},
				{Queue: "qb", Type: "t", Key: "b-1", OrderingKey: "K"},
				{Queue: "qb", Type: "t", Key: "b-2", OrderingKey: "K"},
				{Queue: "qb", Type: "t", Key: "b-free"},
			} {
				ids[e.Key] = b.enqueue(t, e)[0]
			}
			b.waitEvent(t, wa, ids["a-1"], "dead_letter")
			b.waitEvent(t, wa, ids["a-2"], "completed") // qa's t moves on
			b.waitEvent(t, wb, ids["b-1"], "dead_letter")
			b.waitEvent(t, wb, ids["b-free"], "completed") // claims of qb ran after its dead letter
			if r := b.row(t, ids["b-2"]); r.State != "available" || r.Attempts != 0 {
				t.Fatalf("b-2 behind qb's strict dead letter: %+v, want available, never attempted", r)
			}
		})
	}
}

// A registration that changes a queue's recorded choice (a rolling deploy
// that changes OrderingMovesOn) is applied and logged, not refused: the new
// instances must start while the old ones still run.
func TestConflictingOrderingRegistrationIsLogged(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := func(context.Context, *pgoutbox.Delivery) error { return nil }
	cfg := func(movesOn bool, log *slog.Logger) pgoutbox.Config {
		return pgoutbox.Config{
			Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Logger: log,
			Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: h, OrderingMovesOn: movesOn}},
		}
	}
	first := newLogCapture()
	b.startClient(t, cfg(false, first.Logger()))
	second := newLogCapture()
	b.startClient(t, cfg(true, second.Logger()))
	changed := func(r slog.Record) bool {
		return r.Level == slog.LevelWarn && attr(r, "queue").String() == "q" && attr(r, "effect_type").String() == "t"
	}
	if got := first.matching(changed); len(got) != 0 {
		t.Fatalf("the first registration logged a change: %v", got[0].Message)
	}
	got := second.matching(changed)
	if len(got) != 1 || attr(got[0], "dead_letter").String() != "moves on" || attr(got[0], "former").String() != "strict" {
		t.Fatalf("changing the recorded choice logged %d warnings, want one from strict to moves on", len(got))
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.ordering_choices WHERE queue = 'q' AND effect_type = 't' AND dead_letter_moves_on`); n != 1 {
		t.Fatalf("the later registration was not applied (%d rows)", n)
	}
}
