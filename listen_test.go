package pgoutbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

func listenerCount(t *testing.T, b *bundle) int64 {
	return b.scalar(t, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'pgoutbox-listener' AND datname = current_database()`)
}

func noop(context.Context, *pgoutbox.Delivery) error { return nil }

func TestNotifyWakesWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startClient(t, pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		PollInterval: time.Hour, // only a NOTIFY can wake the claim loop
	})
	events := watch(t, c)
	b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	b.waitEvent(t, events, id, "completed")
}

func TestListenerTerminatedFallsBackToPolling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startClient(t, pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		PollInterval: 200 * time.Millisecond,
	})
	events := watch(t, c)
	b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })
	if n := b.scalar(t, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'pgoutbox-listener' AND datname = current_database()) t`); n != 1 {
		t.Fatalf("terminated %d listeners", n)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "after-terminate"})[0]
	b.waitEvent(t, events, id, "completed")
	// And the listener comes back.
	b.waitFor(t, "listener reconnected", func() bool { return listenerCount(t, b) == 1 })
	id2 := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "after-reconnect"})[0]
	b.waitEvent(t, events, id2, "completed")
}

func TestNotifyLimiterFoldsConcurrentProducers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listener, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(b.ctx, "LISTEN pgoutbox_effects"); err != nil {
		t.Fatal(err)
	}
	// A takes the queue's notification; B, while A is open, skips it.
	a, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback(b.ctx) }()
	if _, err := pgoutbox.Enqueue(b.ctx, a, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "b"})
	if err := a.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	// A sentinel on another queue: notifications arrive in commit order, so
	// once it arrives every earlier one has.
	b.enqueue(t, pgoutbox.Effect{Queue: "qc", Type: "t", Key: "c"})
	counts := map[string]int{}
	for counts["qc"] == 0 {
		n, err := listener.Conn().WaitForNotification(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts[n.Payload]++
	}
	if counts["qa"] != 1 {
		t.Fatalf("%d notifications for qa from two producers, want 1 (folded)", counts["qa"])
	}
}
