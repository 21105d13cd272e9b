package pgoutbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// A paused queue (migration 00023) is not claimed by a running Client in
// either lease mode, nor by one started while it is paused (a restart);
// enqueues into it go on; a resume lets its effects be delivered. Progress,
// not a clock, shows that the Client did claim while paused: the claim
// statement probes pgoutbox.queue_pauses once per run, and the test waits
// for several such probes after its enqueue committed (or a delivery).
func TestPausedQueueIsNotClaimed(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name  string
		lease time.Duration
	}{{"row-lock", 5 * time.Second}, {"durable", pgoutbox.RowLockLeaseOff}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var calls atomic.Int64
			cfg := pgoutbox.Config{
				ID: "pause-" + mode.name, PollInterval: 10 * time.Millisecond,
				Queues: map[string]pgoutbox.QueueConfig{"p": {Concurrency: 4, RowLockLease: mode.lease}},
				Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
					calls.Add(1)
					return nil
				}}},
			}
			if _, err := ops.PauseQueue(b.ctx, b.pool, ops.PauseOptions{Queue: "p", By: "test", Reason: "incident"}); err != nil {
				t.Fatal(err)
			}
			probes := func() int64 {
				return b.scalar(t, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables
					WHERE schemaname = 'pgoutbox' AND relname = 'queue_pauses'`)
			}
			claimedWhilePaused := func(what string) {
				t.Helper()
				from := probes()
				b.waitFor(t, what+": the client's claims ran", func() bool { return probes() >= from+5 || calls.Load() > 0 })
				if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'p' AND state = 'available' AND attempts = 0`); n != 3 || calls.Load() != 0 {
					t.Fatalf("%s: %d of 3 effects unclaimed, %d deliveries; a paused queue must not be claimed", what, n, calls.Load())
				}
			}

			first, err := pgoutbox.NewClient(b.pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			effects := make([]pgoutbox.Effect, 3)
			for i := range effects {
				effects[i] = pgoutbox.Effect{Queue: "p", Type: "t", Key: fmt.Sprint(i)}
			}
			ids := b.enqueue(t, effects...) // enqueues go on while paused
			claimedWhilePaused("running client")
			if err := first.Stop(b.ctx); err != nil {
				t.Fatal(err)
			}

			// A restart: the pause is in the database, not in the process.
			c := b.startClient(t, cfg)
			w := watch(t, c)
			claimedWhilePaused("restarted client")

			if _, paused, err := ops.ResumeQueue(b.ctx, b.pool, ops.PauseOptions{Queue: "p"}); err != nil || !paused {
				t.Fatalf("resume: paused=%v %v", paused, err)
			}
			for _, id := range ids {
				b.waitEvent(t, w, id, "completed")
			}
			if calls.Load() != 3 {
				t.Fatalf("%d deliveries after the resume, want 3", calls.Load())
			}
		})
	}
}
