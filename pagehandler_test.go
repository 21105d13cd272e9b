package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
)

// oneLane is batchCfg("bq") with one lane, whatever PGOUTBOX_TEST_LANES
// says: the tests count the effects of one page per call.
func oneLane(types ...pgoutbox.EffectType) pgoutbox.Config {
	cfg := batchCfg("bq", types...)
	q := cfg.Queues["bq"]
	q.Lanes = 1
	cfg.Queues["bq"] = q
	return cfg
}

// recordBatch records queue bq's batch storage (one lane), so that the
// effects enqueued before its Client starts go to the stream.
func recordBatch(t *testing.T, b *bundle) {
	t.Helper()
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "bq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
}

// pageCalls records a PageHandler's calls: the keys and attempts of each.
type pageCalls struct {
	mu    sync.Mutex
	calls [][]string
	seen  *counter
}

func (p *pageCalls) note(ds []*pgoutbox.Delivery) {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, len(ds))
	for i, d := range ds {
		keys[i] = fmt.Sprintf("%s#%d", d.Key, d.Attempt)
	}
	p.calls = append(p.calls, keys)
}

// sizes is each call's number of deliveries, in call order.
func (p *pageCalls) sizes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int, len(p.calls))
	for i, c := range p.calls {
		out[i] = len(c)
	}
	return out
}

// TestPageHandlerDeliversAPageInOneCall: a batch queue calls a PageHandler
// once with every effect of its type in the page that may run from the
// batch (an ordering key's first only), each delivery's error is its own
// (one retried, the others completed from the batch with no row), and the
// retry and the key's second effect, delivered from pgoutbox.effects, come
// one per call. The page's Handler type's effects are delivered apart.
func TestPageHandlerDeliversAPageInOneCall(t *testing.T) {
	b := setup(t)
	calls := &pageCalls{seen: newCounter()}
	single := newCounter()
	cfg := oneLane(
		pgoutbox.EffectType{Name: "bulk", ReplaySafe: true, PageHandler: func(_ context.Context, ds []*pgoutbox.Delivery) []error {
			calls.note(ds)
			errs := make([]error, len(ds))
			for i, d := range ds {
				calls.seen.add(d)
				if d.Key == "k-7" && d.Attempt == 1 {
					errs[i] = pgoutbox.Retry(errors.New("k-7 fails once"))
				}
			}
			return errs
		}},
		pgoutbox.EffectType{Name: "one", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			single.add(d)
			return nil
		}})
	var effects []pgoutbox.Effect
	for i := range 30 {
		effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: fmt.Sprintf("k-%d", i)})
		if i%10 == 0 {
			effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "one", Key: fmt.Sprintf("one-%d", i)})
		}
	}
	effects = append(effects,
		pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "o-1", OrderingKey: "o"},
		pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "o-2", OrderingKey: "o"})
	// Enqueued before the Client starts: its first tick makes one batch, of
	// one page (PageSize 100).
	recordBatch(t, b)
	ids := b.enqueue(t, effects...)
	c := b.startClient(t, cfg)
	waitCompleted(t, b, ids)

	sizes := calls.sizes()
	calls.mu.Lock()
	first := slices.Clone(calls.calls[0])
	rest := slices.Clone(calls.calls[1:])
	calls.mu.Unlock()
	if len(first) != 31 || slices.Contains(first, "o-2#1") {
		t.Errorf("the first call delivered %d effects %v, want the page's 31 that may run from the batch (not o-2)",
			len(first), first)
	}
	slices.SortFunc(rest, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	if want := [][]string{{"k-7#2"}, {"o-2#1"}}; !slices.EqualFunc(rest, want, slices.Equal) {
		t.Errorf("calls after the page: %v (sizes %v), want %v, one delivery each", rest, sizes, want)
	}
	for i, id := range ids {
		want := 1
		if effects[i].Key == "k-7" {
			want = 2
		}
		if n := calls.seen.count(id) + single.count(id); n != want {
			t.Errorf("effect %s delivered %d times, want %d", effects[i].Key, n, want)
		}
	}
	calls.seen.mu.Lock()
	order := calls.seen.order["o"]
	calls.seen.mu.Unlock()
	if !slices.Equal(order, ids[len(ids)-2:]) {
		t.Errorf("key o delivered in order %v, want %v", order, ids[len(ids)-2:])
	}
	// Only the exceptions have a row: the retried effect and the key's
	// second, moved behind its first.
	if n := b.count(t); n != 2 {
		t.Errorf("%d rows in pgoutbox.effects, want 2 (k-7's retry and o-2)", n)
	}
	if n := c.BatchRunContexts(); n != 0 {
		t.Errorf("%d delivery contexts still live after the page settled", n)
	}
}

// TestPageHandlerMiscountFailsTheCall: a PageHandler that returns a number
// of errors other than its deliveries' fails every delivery of the call,
// and so does its panic; each is retried, and completes when the handler
// answers for it.
func TestPageHandlerMiscountFailsTheCall(t *testing.T) {
	b := setup(t)
	calls := &pageCalls{seen: newCounter()}
	cfg := oneLane(pgoutbox.EffectType{Name: "bulk", ReplaySafe: true,
		PageHandler: func(_ context.Context, ds []*pgoutbox.Delivery) []error {
			calls.note(ds)
			for _, d := range ds {
				calls.seen.add(d)
			}
			switch {
			case ds[0].Key == "panic" && ds[0].Attempt == 1:
				panic("page handler panics")
			case len(ds) > 1:
				return []error{nil} // one answer for a page of several
			}
			return nil
		}})
	recordBatch(t, b)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "a"},
		pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "b"},
		pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "c"})
	b.startClient(t, cfg)
	waitCompleted(t, b, ids)
	for i, id := range ids {
		if got := b.row(t, id); got.State != "completed" || got.Attempts != 2 || calls.seen.count(id) != 2 {
			t.Errorf("effect %d: %s after %d attempts, %d calls; want completed after 2: the miscounted call failed it",
				i, got.State, got.Attempts, calls.seen.count(id))
		}
	}
	// A panic: the row path's call of one fails too.
	later := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: "panic"})
	waitCompleted(t, b, later)
	if got := b.row(t, later[0]); got.State != "completed" || got.Attempts != 2 {
		t.Errorf("the panicking call's effect: %s after %d attempts, want completed after 2", got.State, got.Attempts)
	}
}

// TestPageHandlerOutlivesPageHold: a PageHandler call still running after
// PageHold has each of its effects promoted to a durable lease; the page
// settles and the queue goes on, and when the call returns each effect
// completes under its lease, delivered once.
func TestPageHandlerOutlivesPageHold(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	calls := &pageCalls{seen: newCounter()}
	fast := newCounter()
	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch, Lanes: 1, Concurrency: 4,
			PageHold: 20 * time.Millisecond}},
		Types: []pgoutbox.EffectType{
			{Name: "slow", ReplaySafe: true, PageHandler: func(ctx context.Context, ds []*pgoutbox.Delivery) []error {
				calls.note(ds)
				select {
				case <-release:
				case <-ctx.Done():
					return []error{context.Cause(ctx), context.Cause(ctx)}
				}
				for _, d := range ds {
					calls.seen.add(d)
				}
				return nil
			}},
			{Name: "fast", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				fast.add(d)
				return nil
			}},
		},
	}
	recordBatch(t, b)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "bq", Type: "slow", Key: "s-1"},
		pgoutbox.Effect{Queue: "bq", Type: "slow", Key: "s-2"})
	c := b.startClient(t, cfg)
	w := watch(t, c)
	b.waitFor(t, "both slow effects promoted to durable leases", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = ANY($1) AND state = 'leased'
			AND lease_token IS NOT NULL`, ids) == 2
	})
	later := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "fast", Key: "later"})[0]
	b.waitEvent(t, w, later, "completed")
	close(release)
	waitCompleted(t, b, ids)
	for _, id := range ids {
		if got := b.row(t, id); got.State != "completed" || got.Attempts != 1 || calls.seen.count(id) != 1 {
			t.Errorf("effect %d: %s after %d attempts, delivered %d times; want completed after 1, once",
				id, got.State, got.Attempts, calls.seen.count(id))
		}
	}
	if got := calls.sizes(); !slices.Equal(got, []int{2}) {
		t.Errorf("calls %v, want one of 2", got)
	}
	b.waitFor(t, "every delivery context cancelled", func() bool { return c.BatchRunContexts() == 0 })
}

// TestPageHandlerRowStorage: a queue of row storage calls a PageHandler
// with one delivery per call.
func TestPageHandlerRowStorage(t *testing.T) {
	b := setup(t)
	calls := &pageCalls{seen: newCounter()}
	b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"rq": {Storage: pgoutbox.StorageRows, Concurrency: 4}},
		Types: []pgoutbox.EffectType{{Name: "bulk", ReplaySafe: true,
			PageHandler: func(_ context.Context, ds []*pgoutbox.Delivery) []error {
				calls.note(ds)
				for _, d := range ds {
					calls.seen.add(d)
				}
				return []error{nil}
			}}},
	})
	var effects []pgoutbox.Effect
	for i := range 5 {
		effects = append(effects, pgoutbox.Effect{Queue: "rq", Type: "bulk", Key: fmt.Sprintf("r-%d", i)})
	}
	ids := b.enqueue(t, effects...)
	waitCompleted(t, b, ids)
	for _, n := range calls.sizes() {
		if n != 1 {
			t.Errorf("calls %v, want one delivery each", calls.sizes())
			break
		}
	}
	for _, id := range ids {
		if n := calls.seen.count(id); n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
}

// TestPageHandlerSpan: a PageHandler call has one consumer span, a root of
// its own, linked to each effect's enqueue span, with the OpenTelemetry
// messaging conventions' batch message count.
func TestPageHandlerSpan(t *testing.T) {
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	recordBatch(t, b)
	var ids []int64
	for i, traceID := range []trace.TraceID{{1}, {3}} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: trace.SpanID{2},
			TraceFlags: trace.FlagsSampled, Remote: true})
		ids = append(ids, b.enqueueCtx(t, trace.ContextWithRemoteSpanContext(b.ctx, sc),
			pgoutbox.Effect{Queue: "bq", Type: "bulk", Key: fmt.Sprintf("traced-%d", i)}))
	}
	cfg := oneLane(pgoutbox.EffectType{Name: "bulk", ReplaySafe: true,
		PageHandler: func(context.Context, []*pgoutbox.Delivery) []error { return nil }})
	cfg.TracerProvider = tp
	b.startClient(t, cfg)
	waitCompleted(t, b, ids)
	var process []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "process bq" {
			process = append(process, s)
		}
	}
	if len(process) != 1 {
		t.Fatalf("%d process spans, want one for the call", len(process))
	}
	s := process[0]
	var linked []trace.TraceID
	for _, l := range s.Links {
		linked = append(linked, l.SpanContext.TraceID())
	}
	if !slices.Equal(linked, []trace.TraceID{{1}, {3}}) || s.Parent.IsValid() || s.SpanKind != trace.SpanKindConsumer {
		t.Errorf("process span: links to traces %v, parent %v, kind %v; want links to both enqueues, a root, consumer",
			linked, s.Parent, s.SpanKind)
	}
	count := false
	for _, a := range s.Attributes {
		count = count || (a.Key == "messaging.batch.message_count" && a.Value.AsInt64() == 2)
	}
	if !count {
		t.Errorf("process span attributes %v, want messaging.batch.message_count 2", s.Attributes)
	}
}
