package nats_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/target/nats"
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
