package pgoutbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox"
)

// Defect 5 (issue #11), end to end: a client stopped while a delivery runs
// releases the effect, routed like every recovery. Interrupted on its last
// attempt, the effect is dead-lettered (it has had MaxAttempts
// deliveries); with attempts left it is available at once, its attempt
// counted.
func TestStopReleaseRespectsMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		maxAttempts int
		want        string
	}{
		{1, "dead_letter"},
		{2, "available"},
	} {
		t.Run(fmt.Sprint("max-attempts=", tc.maxAttempts), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "slow", Key: "k", MaxAttempts: tc.maxAttempts})[0]
			running := make(chan struct{})
			c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 1}},
				Types: []pgoutbox.EffectType{{Name: "slow", ReplaySafe: true, Handler: func(ctx context.Context, _ *pgoutbox.Delivery) error {
					close(running)
					<-ctx.Done() // until the hard stop
					return ctx.Err()
				}}},
				SweepInterval: -1,
				PruneInterval: -1,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-running:
			case <-b.ctx.Done():
				t.Fatal("the delivery never started")
			}
			expired, cancel := context.WithCancel(b.ctx)
			cancel() // no grace: the running delivery is interrupted at once
			if err := c.Stop(expired); err == nil {
				t.Fatal("Stop with a passed deadline reported no interrupted delivery")
			}
			r := b.row(t, id)
			if r.State != tc.want || r.Attempts != 1 {
				t.Fatalf("after a stop interrupted attempt 1/%d: state %s, attempts %d; want %s, 1",
					tc.maxAttempts, r.State, r.Attempts, tc.want)
			}
			if tc.want == "available" && r.AvailableIn > 0 {
				t.Fatalf("a released effect is available only in %.1f s, want at once", r.AvailableIn)
			}
		})
	}
}
