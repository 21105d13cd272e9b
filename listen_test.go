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
