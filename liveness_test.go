package pgoutbox_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// liveWorker returns the live worker with id, if any.
func (b *bundle) liveWorker(t *testing.T, id string) (ops.Worker, bool) {
	t.Helper()
	ws, err := ops.LiveWorkers(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == id {
			return w, true
		}
	}
	return ops.Worker{}, false
}

// A Client with queues is in the live-worker list from its start, with its
// queues, pool sizes and the deliveries it holds; a clean Stop removes it; a
// process that died without stopping drops out after 3 missed heartbeats
// and the next heartbeat of any worker deletes its row; a queue with
// effects and no live worker is reported unserved.
func TestLiveWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	started, release := make(chan struct{}), make(chan struct{})
	cfg := pgoutbox.Config{
		ID:                "live-a",
		HeartbeatInterval: time.Hour, // the test drives the heartbeats after the first
		SampleInterval:    -1,
		Queues: map[string]pgoutbox.QueueConfig{
			"q1": {Concurrency: 3},
			"q2": {Concurrency: 1},
		},
		Types: []pgoutbox.EffectType{{Name: "hold", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}}},
	}
	c, err := pgoutbox.NewClient(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = c.Stop(context.Background())
		}
	})

	b.waitFor(t, "the client's heartbeat row", func() bool { _, ok := b.liveWorker(t, "live-a"); return ok })
	w, _ := b.liveWorker(t, "live-a")
	host, _ := os.Hostname()
	want := []ops.WorkerQueue{{Queue: "q1", Concurrency: 3}, {Queue: "q2", Concurrency: 1}}
	if w.Host != host || w.PID != os.Getpid() || !slices.Equal(w.Queues, want) || w.InFlight != 0 ||
		w.HeartbeatIntervalSeconds != 3600 {
		t.Fatalf("live worker %+v, want host %s pid %d queues %v, nothing in flight", w, host, os.Getpid(), want)
	}

	// A held delivery is in flight at the next heartbeat.
	b.enqueue(t, pgoutbox.Effect{Queue: "q1", Type: "hold", Key: "held"})
	<-started
	if err := c.Heartbeat(b.ctx); err != nil {
		t.Fatal(err)
	}
	if w, _ := b.liveWorker(t, "live-a"); w.InFlight != 1 {
		t.Fatalf("in flight %d while a delivery is held, want 1", w.InFlight)
	}

	// A queue with effects and no worker is unserved; q1 and q2 are served.
	b.enqueue(t, pgoutbox.Effect{Queue: "orphan", Type: "hold", Key: "o1"},
		pgoutbox.Effect{Queue: "orphan", Type: "hold", Key: "o2"})
	unserved, err := ops.UnservedQueues(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(unserved) != 1 || unserved[0].Queue != "orphan" || unserved[0].Available != 2 || unserved[0].Leased != 0 {
		t.Fatalf("unserved %+v, want only orphan with 2 available", unserved)
	}

	// A process killed without Stop: its row stays, with a heartbeat that
	// is 3 intervals old (set on the database clock, not waited for).
	dead := store.WorkerBeat{ID: "killed", Host: "h", PID: 1, Queues: []string{"orphan"}, Concurrency: []int32{1},
		Interval: time.Second, StartedAt: time.Now()}
	if err := store.Heartbeat(b.ctx, b.pool, dead); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.liveWorker(t, "killed"); !ok {
		t.Fatal("a fresh heartbeat is not live")
	}
	if unserved, _ := ops.UnservedQueues(b.ctx, b.pool); len(unserved) != 0 {
		t.Fatalf("unserved %+v while a live worker serves orphan", unserved)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.workers SET heartbeat_at = now() - interval '3.1 seconds' WHERE id = 'killed'`); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.liveWorker(t, "killed"); ok {
		t.Fatal("a worker silent for 3 of its intervals is still live")
	}
	if unserved, _ := ops.UnservedQueues(b.ctx, b.pool); len(unserved) != 1 || unserved[0].Queue != "orphan" {
		t.Fatalf("unserved %+v, want orphan again once its only worker is dead", unserved)
	}
	if err := c.Heartbeat(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.workers WHERE id = 'killed'`); n != 0 {
		t.Fatalf("the dead worker's row survived another worker's heartbeat (%d rows)", n)
	}

	// A clean Stop removes the row.
	close(release)
	stopped = true
	if err := c.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.workers`); n != 0 {
		t.Fatalf("%d worker rows after a clean Stop, want 0", n)
	}
}

// Every Client with queues writes its aggregate samples, whatever wires it
// (serve, work, the demo, a library user): `make demo` wrote none when only
// serve's operator wiring ran a sampler.
func TestClientWritesSamples(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startClient(t, pgoutbox.Config{
		ID:             "sampling",
		SampleInterval: 20 * time.Millisecond,
		Queues:         map[string]pgoutbox.QueueConfig{"q": {}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
			return nil
		}}},
	})
	b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "1"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "2"})
	b.waitFor(t, "samples counting both completions", func() bool {
		return b.scalar(t, `SELECT coalesce(sum(completions), 0) FROM pgoutbox.samples WHERE worker = 'sampling' AND queue = 'q'`) == 2
	})
}
