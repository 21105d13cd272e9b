package nats_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

// calls counts handler calls by idempotency key.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return c.n[key]
}

func (c *calls) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

func TestConsumerOutcomes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	types := []pgoutbox.EffectType{
		{Name: "safe", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			n := seen.add(d.Key)
			switch {
			case d.Key == "retry-once" && n == 1:
				return pgoutbox.Retry(errors.New("503"))
			case d.Key == "permanent":
				return pgoutbox.Permanent(errors.New("422"))
			case d.Key == "always-retry":
				return errors.New("connection refused") // unclassified: a retry for a replay-safe type
			}
			return nil
		}},
		{Name: "dispatch", Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			seen.add(d.Key)
			if d.Key == "dispatch-ambiguous" {
				return pgoutbox.Ambiguous(errors.New("timeout after sending"))
			}
			return nil
		}},
	}
	effects := []pgoutbox.Effect{
		{Queue: "q", Type: "safe", Key: "ok"},
		{Queue: "q", Type: "safe", Key: "retry-once"},
		{Queue: "q", Type: "safe", Key: "permanent"},
		{Queue: "q", Type: "safe", Key: "always-retry", MaxAttempts: 3},
		{Queue: "q", Type: "dispatch", Key: "dispatch-ok"},
		{Queue: "q", Type: "dispatch", Key: "dispatch-ambiguous"},
		{Queue: "q", Type: "unregistered", Key: "unregistered", MaxAttempts: 2},
	}
	ids := b.enqueue(t, effects...)
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: testPolicy})
	b.startConsumer(t, pgnats.ConsumerConfig{Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4}}, Types: types,
		Retry: testPolicy, AckWait: time.Second})

	want := map[string]struct {
		state    string
		attempts int64
	}{
		"ok": {"completed", 1}, "retry-once": {"completed", 2}, "permanent": {"dead_letter", 1},
		"always-retry": {"dead_letter", 3}, "dispatch-ok": {"completed", 1},
		"dispatch-ambiguous": {"reconciliation_required", 1}, "unregistered": {"dead_letter", 2},
	}
	b.waitFor(t, "every effect settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state IN ('completed', 'dead_letter', 'reconciliation_required')`) == int64(len(ids))
	})
	for key, w := range want {
		var state string
		var attempts int64
		if err := b.pool.QueryRow(b.ctx, `SELECT state::text, attempts FROM pgoutbox.effects WHERE idempotency_key = $1`, key).
			Scan(&state, &attempts); err != nil {
			t.Fatal(err)
		}
		if state != w.state || attempts != w.attempts {
			t.Errorf("%s: %s after %d attempts, want %s after %d", key, state, attempts, w.state, w.attempts)
		}
	}
	if n := seen.get("dispatch-ambiguous"); n != 1 {
		t.Errorf("the ambiguous dispatch was sent %d times, want exactly 1", n)
	}
	if n := seen.get("always-retry"); n != 3 {
		t.Errorf("always-retry delivered %d times, want 3 (max attempts)", n)
	}
	// Retries were redelivered by JetStream: still one message per effect,
	// and every message was settled (acked or terminated).
	b.waitFor(t, "the stream to be drained", func() bool {
		msgs, _ := b.streamState(t, pgnats.StreamNameDefault)
		return msgs == 0
	})
	if _, last := b.streamState(t, pgnats.StreamNameDefault); last != uint64(len(ids)) {
		t.Fatalf("stream stored %d messages for %d effects", last, len(ids))
	}
}

func TestConsumerConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	noop := func(context.Context, *pgoutbox.Delivery) error { return nil }
	pageNoop := func(context.Context, []*pgoutbox.Delivery) []error { return nil }
	cases := map[string]pgnats.ConsumerConfig{
		"ack wait not below lease": {Queues: map[string]pgoutbox.QueueConfig{"q": {}},
			Retry: pgnats.RetryPolicy{LeaseDuration: time.Minute}, AckWait: time.Minute},
		"max deliver not above attempts": {Queues: map[string]pgoutbox.QueueConfig{"q": {}}, MaxDeliver: 8},
		"queue not a subject token":      {Queues: map[string]pgoutbox.QueueConfig{"a.b": {}}},
		"no queues":                      {},
		"delivery timeout not below lease": {Queues: map[string]pgoutbox.QueueConfig{"q": {DeliveryTimeout: time.Minute}},
			Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}}},
		"handler and page handler": {Queues: map[string]pgoutbox.QueueConfig{"q": {}},
			Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop, PageHandler: pageNoop}}},
		"page handler not replay-safe": {Queues: map[string]pgoutbox.QueueConfig{"q": {}},
			Types: []pgoutbox.EffectType{{Name: "t", PageHandler: pageNoop}}},
	}
	for name, cfg := range cases {
		if _, err := pgnats.NewConsumer(b.pool, b.js, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A message's last JetStream delivery is never left pending: a retry is
// then scheduled in PostgreSQL, the relay finds the old message consumed and
// publishes the effect again under a derived message id, until attempts run
// out.
func TestLastDeliveryFallsBackToPostgres(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var seen calls
	policy := pgnats.RetryPolicy{MaxAttempts: 1, BackoffCap: 50 * time.Millisecond, LeaseDuration: 3 * time.Second}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "flaky", Key: "k", MaxAttempts: 5})
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: policy, PollInterval: 20 * time.Millisecond})
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Retry: policy, AckWait: time.Second, MaxDeliver: 2,
		Types: []pgoutbox.EffectType{{Name: "flaky", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			seen.add(d.Key)
			return pgoutbox.Retry(errors.New("503"))
		}}},
	})
	b.waitFor(t, "the effect dead-lettered", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`) == 1
	})
	if n := b.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE id = $1`, ids[0]); n != 5 || seen.get("k") != 5 {
		t.Fatalf("%d attempts, %d deliveries; want 5 and 5", n, seen.get("k"))
	}
	// Two deliveries per message: messages 1 and 2 ended on their last
	// delivery, message 3 carried attempt 5.
	b.waitFor(t, "the stream to be drained", func() bool {
		msgs, _ := b.streamState(t, pgnats.StreamNameDefault)
		return msgs == 0
	})
	if _, last := b.streamState(t, pgnats.StreamNameDefault); last != 3 {
		t.Fatalf("%d messages stored, want 3", last)
	}
}

func TestRelayPublishFailureReleasesWithoutCountingAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: testPolicy, PollInterval: 20 * time.Millisecond})
	if err := b.js.DeleteStream(b.ctx, pgnats.StreamNameDefault); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "noop", Key: "k"})
	b.waitFor(t, "the failed publish recorded", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'available'
			AND last_error LIKE 'relay publish failed%'`, ids[0]) == 1
	})
	if n := b.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE id = $1`, ids[0]); n != 0 {
		t.Fatalf("a failed publish counted %d attempts", n)
	}
	// Once the stream is back, the effect is relayed.
	if _, err := pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{}, testPolicy, []string{"q"}); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the effect handed over", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE lease_owner = $1`, handoff.Owner) == 1
	})
}
