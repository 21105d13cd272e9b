package nats_test

import (
	"context"
	"testing"

	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The relay serves its queues: it is a live worker while it runs (so the
// console does not warn that no worker serves them), gone after Stop.
func TestRelayIsALiveWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.startRelay(t, pgnats.RelayConfig{Queues: []string{"r", "q"}, Retry: testPolicy, Concurrency: 3})
	live := func() []ops.Worker {
		ws, err := ops.LiveWorkers(b.ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	pgtest.WaitFor(t, b.ctx, "the relay's heartbeat row", func() bool { return len(live()) == 1 })
	w := live()[0]
	if w.ID != r.ID() || len(w.Queues) != 2 || w.Queues[0] != (ops.WorkerQueue{Queue: "q", Concurrency: 3}) ||
		w.Queues[1] != (ops.WorkerQueue{Queue: "r", Concurrency: 3}) {
		t.Fatalf("live worker %+v, want the relay %s serving q and r", w, r.ID())
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ws := live(); len(ws) != 0 {
		t.Fatalf("live workers after the relay stopped: %+v", ws)
	}
}
