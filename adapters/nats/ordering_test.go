package nats_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
)

// The relay keeps per-key order: it claims with the engine's head-of-line
// rule, and a relayed effect stays leased (handed over) until a consumer
// completes it, so a key's next effect is published only after the previous
// one was delivered. Every third effect fails its first delivery (a
// JetStream redelivery). The handler's log proves, per key: effects
// delivered in enqueue order, one at a time, none missing.
func TestRelayKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const keys, perKey = 10, 12
	var effects []pgoutbox.Effect
	for i := range perKey {
		for k := range keys {
			effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "ordered", Key: fmt.Sprintf("k%d-%d", k, i),
				Payload: map[string]any{"k": k, "i": i}, OrderingKey: fmt.Sprintf("k%d", k)})
		}
	}
	// One transaction per effect, so that the key's order is commit order.
	for _, e := range effects {
		b.enqueue(t, e)
	}
	var (
		mu       sync.Mutex
		inFlight = map[string]string{} // ordering key → the effect being delivered
		next     = map[string]int{}    // ordering key → the next index expected
		failures []string
		failed   = map[string]bool{}
	)
	handler := func(_ context.Context, d *pgoutbox.Delivery) error {
		var k, i int
		if _, err := fmt.Sscanf(d.Key, "k%d-%d", &k, &i); err != nil {
			return pgoutbox.Permanent(err)
		}
		okey := fmt.Sprintf("k%d", k)
		mu.Lock()
		if d.OrderingKey != okey {
			failures = append(failures, fmt.Sprintf("%s: Delivery.OrderingKey %q, want %q", d.Key, d.OrderingKey, okey))
		}
		if other, ok := inFlight[okey]; ok {
			failures = append(failures, fmt.Sprintf("%s delivered while %s is in flight", d.Key, other))
		}
		if i != next[okey] {
			failures = append(failures, fmt.Sprintf("%s delivered, want index %d of %s", d.Key, next[okey], okey))
		}
		inFlight[okey] = d.Key
		fail := i%3 == 0 && !failed[d.Key]
		failed[d.Key] = true
		mu.Unlock()
		defer func() {
			mu.Lock()
			delete(inFlight, okey)
			if !fail {
				next[okey] = i + 1
			}
			mu.Unlock()
		}()
		if fail {
			return pgoutbox.Retry(errors.New("503"))
		}
		return nil
	}
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Batch: 100, PollInterval: 50 * time.Millisecond, Retry: testPolicy})
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 16}}, Retry: testPolicy, AckWait: time.Second,
		Types: []pgoutbox.EffectType{{Name: "ordered", ReplaySafe: true, Handler: handler}},
	})
	b.waitFor(t, "every effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == keys*perKey
	})
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d ordering violations, first: %v", len(failures), failures[:min(5, len(failures))])
	}
	for k := range keys {
		if n := next[fmt.Sprintf("k%d", k)]; n != perKey {
			t.Fatalf("key k%d: %d effects delivered in order, want %d", k, n, perKey)
		}
	}
}

// The NATS path keeps the move-on choices (issue 28, point 7): the consumer
// records its types' ordering choices for its queues when it starts, so a
// move-on type's dead letter lets its key move on through the relay, and a
// strict one holds its key back.
func TestRelayedMoveOnDeadLetterLetsItsKeyMoveOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := func(_ context.Context, d *pgoutbox.Delivery) error {
		if d.Key == "moveon-1" || d.Key == "strict-1" {
			return pgoutbox.Permanent(errors.New("422"))
		}
		return nil
	}
	ids := map[string]int64{}
	for _, e := range []pgoutbox.Effect{
		{Queue: "q", Type: "moveon", Key: "moveon-1", OrderingKey: "A"},
		{Queue: "q", Type: "moveon", Key: "moveon-2", OrderingKey: "A"},
		{Queue: "q", Type: "strict", Key: "strict-1", OrderingKey: "B"},
		{Queue: "q", Type: "strict", Key: "strict-2", OrderingKey: "B"},
	} {
		ids[e.Key] = b.enqueue(t, e)[0] // one transaction each: commit order is enqueue order
	}
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, PollInterval: 50 * time.Millisecond, Retry: testPolicy})
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Retry: testPolicy, AckWait: time.Second,
		Types: []pgoutbox.EffectType{
			{Name: "moveon", ReplaySafe: true, Handler: h, OrderingMovesOn: true},
			{Name: "strict", ReplaySafe: true, Handler: h},
		},
	})
	b.waitFor(t, "the move-on key to move on", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'`, ids["moveon-2"]) == 1
	})
	b.waitFor(t, "the strict head to be dead-lettered", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'dead_letter'`, ids["strict-1"]) == 1
	})
	// The relay's claims ran after the strict dead letter: an unordered
	// effect enqueued now is delivered, and strict-2 still waits.
	free := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "strict", Key: "free"})[0]
	b.waitFor(t, "an unordered effect delivered", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'`, free) == 1
	})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'available' AND attempts = 0`, ids["strict-2"]); n != 1 {
		t.Fatal("strict-2 was relayed behind a strict dead letter")
	}
}

// A relay whose consumers run elsewhere records RelayConfig.Types' ordering
// choices for its queues when it starts, as a Client does.
func TestRelayRecordsOrderingChoices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q", "r"}, Retry: testPolicy,
		Types: []pgoutbox.EffectType{{Name: "moveon", OrderingMovesOn: true}, {Name: "strict"}}})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.ordering_choices
		WHERE queue IN ('q', 'r') AND dead_letter_moves_on = (effect_type = 'moveon')`); n != 4 {
		t.Fatalf("%d ordering choices recorded for the relay's 2 queues and 2 types, want 4", n)
	}
}
