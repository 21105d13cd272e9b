package nats_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

func TestRelay100kEffects(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 effects; skipped with -short")
	}
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute) // a safety net, not a timing assertion
	defer cancel()
	b.ctx = ctx
	const total = 100_000
	effects := make([]pgoutbox.Effect, total)
	for i := range effects {
		effects[i] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: pgoutbox.Key("noop", strconv.Itoa(i)),
			Payload: map[string]any{"n": i}}
	}
	ids := b.enqueue(t, effects...)

	// Relay everything with no consumer running: the stream holds exactly
	// one message per effect and every effect is handed over.
	reg := prometheus.NewRegistry()
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"bulk"}, Batch: 1000, Registerer: reg})
	handedOver := func() int64 {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND lease_owner = $1`, handoff.Owner)
	}
	b.waitFor(t, "every effect handed over", func() bool { return handedOver() == total })
	if msgs, last := b.streamState(t, pgnats.StreamNameDefault); msgs != total || last != total {
		t.Fatalf("stream holds %d messages (last sequence %d) for %d effects", msgs, last, total)
	}

	// Relay retries are deduplicated by Nats-Msg-Id: 5,000 effects whose
	// hand-over lease expired (as if JetStream had lost track of them) are
	// recovered by the sweeper and published again, and the stream stores
	// nothing new.
	b.expire(t, ids[:5000]...)
	if n := b.sweep(t); n != 5000 {
		t.Fatalf("swept %d, want 5000", n)
	}
	b.waitFor(t, "the recovered effects handed over again", func() bool { return handedOver() == total })
	if msgs, last := b.streamState(t, pgnats.StreamNameDefault); msgs != total || last != total {
		t.Fatalf("after relaying 5,000 effects again the stream holds %d messages (last sequence %d), want %d", msgs, last, total)
	}
	if dups := counter(t, reg, "pgoutbox_relay_duplicates_total"); dups != 5000 {
		t.Fatalf("%v duplicate acks, want 5000", dups)
	}

	// Consumers deliver every effect once and complete it in PostgreSQL.
	delivered := make([]atomic.Int32, total+1)
	first := ids[0]
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: 128}},
		Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			delivered[d.ID-first].Add(1)
			return nil
		}}},
	})
	b.waitFor(t, "every effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == total
	})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE attempts <> 1`); n != 0 {
		t.Fatalf("%d effects took more than one attempt", n)
	}
	twice, never := 0, 0
	for i := range total {
		switch delivered[i].Load() {
		case 0:
			never++
		case 1:
		default:
			twice++
		}
	}
	if never != 0 || twice != 0 {
		t.Fatalf("%d effects never delivered, %d delivered more than once", never, twice)
	}
	b.waitFor(t, "the stream to be drained", func() bool {
		msgs, _ := b.streamState(t, pgnats.StreamNameDefault)
		return msgs == 0
	})
	if _, last := b.streamState(t, pgnats.StreamNameDefault); last != total {
		t.Fatalf("stream stored %d messages in all, want %d", last, total)
	}
}

// counter sums a counter family of a registry.
func counter(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func TestDuplicateWindowShorterThanHorizonIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "noop", Key: "k"})
	// JetStream's default duplicate window is two minutes.
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{
		Name: pgnats.StreamNameDefault, Subjects: []string{"pgoutbox.>"}, Retention: jetstream.WorkQueuePolicy,
		Duplicates: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}
	policy := pgnats.RetryPolicy{} // defaults: 8 attempts, 300 s cap, 60 s lease
	r, err := pgnats.NewRelay(b.pool, b.js, pgnats.RelayConfig{Queues: []string{"q"}, Retry: policy})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Start(b.ctx)
	if !errors.Is(err, pgnats.ErrDuplicateWindow) {
		t.Fatalf("relay start: %v, want ErrDuplicateWindow", err)
	}
	horizon := policy.Horizon()
	for _, want := range []string{"2m0s", horizon.String(), "retry horizon", "--dupe-window"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	c, err := pgnats.NewConsumer(b.pool, b.js, pgnats.ConsumerConfig{Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Retry: policy})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); !errors.Is(err, pgnats.ErrDuplicateWindow) {
		t.Fatalf("consumer start: %v, want ErrDuplicateWindow", err)
	}
	// Nothing was claimed or published.
	if st := b.states(t); st["available"] != 1 || b.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE id = $1`, ids[0]) != 0 {
		t.Fatalf("after the refusal: %v", st)
	}
	if msgs, _ := b.streamState(t, pgnats.StreamNameDefault); msgs != 0 {
		t.Fatalf("%d messages published by a refused relay", msgs)
	}
	// A window that covers the horizon is accepted.
	if _, err := b.js.UpdateStream(b.ctx, jetstream.StreamConfig{
		Name: pgnats.StreamNameDefault, Subjects: []string{"pgoutbox.>"}, Retention: jetstream.WorkQueuePolicy,
		Duplicates: horizon,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{}, policy, []string{"q"}); err != nil {
		t.Fatalf("window = horizon refused: %v", err)
	}
	// Asking for a short window on a new stream is refused too.
	_, err = pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{Name: "OTHER", SubjectPrefix: "other", DuplicateWindow: time.Minute}, policy, nil)
	if !errors.Is(err, pgnats.ErrDuplicateWindow) {
		t.Fatalf("new stream with a 1m window: %v", err)
	}
}

func TestStreamCreatedOrChecked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	policy := pgnats.RetryPolicy{}
	st, err := pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{}, policy, []string{"q"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.Retention != jetstream.WorkQueuePolicy || cfg.Duplicates < policy.Horizon() || cfg.Duplicates%time.Minute != 0 ||
		len(cfg.Subjects) != 1 || cfg.Subjects[0] != "pgoutbox.>" {
		t.Fatalf("created stream: %+v", cfg)
	}
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{
		Name: "LIMITS", Subjects: []string{"limits.>"}, Duplicates: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	_, err = pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{Name: "LIMITS", SubjectPrefix: "limits"}, policy, []string{"q"})
	if !errors.Is(err, pgnats.ErrStreamConfig) || !strings.Contains(err.Error(), "work-queue") {
		t.Fatalf("limits retention: %v", err)
	}
	if _, err := pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{}, policy, []string{"a.b"}); err == nil {
		t.Fatal("a queue name with a dot was accepted")
	}
}
