package httpdelivery_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// traced is an application and a delivery target, both traced into one
// in-memory exporter: the application's handler enqueues an effect in its
// request's span, a Client delivers it with httpdelivery, and the target
// continues the traceparent it receives.
type traced struct {
	b      pgtest.Bundle
	exp    *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	app    *httptest.Server
	target *httptest.Server

	mu      sync.Mutex
	got     []string // the traceparent of each request the target received
	failFor int      // the target answers 503 to the first failFor attempts
}

func newTraced(t *testing.T) *traced {
	tr := &traced{b: pgtest.NewBundle(t, 2*time.Minute), exp: tracetest.NewInMemoryExporter()}
	tr.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(tr.exp))
	t.Cleanup(func() { _ = tr.tp.Shutdown(context.Background()) })
	w3c := propagation.TraceContext{}
	// The application: one span per request (what otelhttp makes), in which
	// the handler enqueues.
	tr.app = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tr.tp.Tracer("app").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		err := pgx.BeginFunc(ctx, tr.b.Pool, func(tx pgx.Tx) error {
			_, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "hooks", Type: "hook.safe",
				Key: r.URL.Query().Get("key"), Payload: map[string]any{"order": 1}})
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(tr.app.Close)
	// The target: a span continuing the traceparent it receives.
	tr.target = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := w3c.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		_, span := tr.tp.Tracer("target").Start(ctx, "POST /hooks", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		attempt, _ := strconv.Atoi(r.Header.Get("pgoutbox-attempt"))
		tr.mu.Lock()
		tr.got = append(tr.got, r.Header.Get("traceparent"))
		tr.mu.Unlock()
		if attempt <= tr.failFor {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(tr.target.Close)
	return tr
}

// request is the application's caller: a client span whose traceparent
// the request carries. It returns the client span's context.
func (tr *traced) request(t *testing.T, key string) trace.SpanContext {
	ctx, span := tr.tp.Tracer("caller").Start(tr.b.Ctx, "order", trace.WithSpanKind(trace.SpanKindClient))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tr.app.URL+"/orders?key="+key, nil)
	if err != nil {
		t.Fatal(err)
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	span.End()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the application answered %d", resp.StatusCode)
	}
	return span.SpanContext()
}

// deliver runs a Client that delivers the queue "hooks" to the target until
// every effect of it is completed, then stops it (which waits for the
// deliveries' spans to end).
func (tr *traced) deliver(t *testing.T, rowLock time.Duration) {
	d, err := httpdelivery.New(httpdelivery.Endpoint{Name: "target", URL: tr.target.URL + "/hooks", Secret: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgoutbox.NewClient(tr.b.Pool, pgoutbox.Config{
		SweepInterval: -1, PruneInterval: -1, Logger: slog.New(slog.DiscardHandler),
		BackoffCap:     time.Millisecond, // a retry is due at once
		TracerProvider: tr.tp,
		Queues:         map[string]pgoutbox.QueueConfig{"hooks": {Concurrency: 2, RowLockLease: rowLock}},
		Types:          []pgoutbox.EffectType{{Name: "hook.safe", ReplaySafe: true, Handler: d.Handler()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(tr.b.Ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, tr.b.Ctx, "every effect completed", func() bool {
		return pgtest.Scalar(t, tr.b.Ctx, tr.b.Pool,
			`SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`) == 0
	})
	if err := c.Stop(tr.b.Ctx); err != nil {
		t.Fatal(err)
	}
}

// spans returns the ended spans by name; each name must occur want times.
func (tr *traced) spans(t *testing.T, name string, want int) []tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	if len(out) != want {
		t.Fatalf("%d spans %q, want %d (all: %v)", len(out), name, want, names(tr.exp.GetSpans()))
	}
	return out
}

func names(ss tracetest.SpanStubs) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name + "(" + s.SpanKind.String() + ")"
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// childOf fails unless s is a child of parent.
func childOf(t *testing.T, s tracetest.SpanStub, parent trace.SpanContext) {
	t.Helper()
	if s.Parent.TraceID() != parent.TraceID() || s.Parent.SpanID() != parent.SpanID() ||
		s.SpanContext.TraceID() != parent.TraceID() {
		t.Errorf("span %q: parent %s/%s, want %s/%s", s.Name, s.Parent.TraceID(), s.Parent.SpanID(),
			parent.TraceID(), parent.SpanID())
	}
}

// TestOneTraceFromRequestToTarget: an HTTP request whose handler enqueues,
// the delivery and the HTTP target are one trace, in both lease modes:
// caller → application (SERVER) → send hooks (PRODUCER) → process hooks
// (CONSUMER, also linked to the send span) → target (SERVER). The effect
// row keeps the send span's traceparent; the spans carry the messaging
// attributes and no payload.
func TestOneTraceFromRequestToTarget(t *testing.T) {
	for _, mode := range []struct {
		name    string
		rowLock time.Duration
	}{{"rowlock", 0}, {"durable", pgoutbox.RowLockLeaseOff}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			tr := newTraced(t)
			caller := tr.request(t, "order-1")
			tr.deliver(t, mode.rowLock)

			app := tr.spans(t, "POST /orders", 1)[0]
			childOf(t, app, caller)
			send := tr.spans(t, "send hooks", 1)[0]
			childOf(t, send, app.SpanContext)
			if send.SpanKind != trace.SpanKindProducer || attr(send, "messaging.system") != "pgoutbox" ||
				attr(send, "messaging.operation.type") != "send" || attr(send, "messaging.destination.name") != "hooks" ||
				attr(send, "messaging.message.id") == "" {
				t.Errorf("send span: kind %s, attributes %v", send.SpanKind, send.Attributes)
			}
			var stored string
			if err := tr.b.Pool.QueryRow(tr.b.Ctx, `SELECT traceparent FROM pgoutbox.effects`).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if want := "00-" + send.SpanContext.TraceID().String() + "-" + send.SpanContext.SpanID().String() + "-01"; stored != want {
				t.Errorf("the row keeps traceparent %q, want the send span's %q", stored, want)
			}

			process := tr.spans(t, "process hooks", 1)[0]
			childOf(t, process, send.SpanContext)
			if len(process.Links) != 1 || process.Links[0].SpanContext.SpanID() != send.SpanContext.SpanID() {
				t.Errorf("process span: links %v, want one to the send span", process.Links)
			}
			want := map[string]string{"messaging.system": "pgoutbox", "messaging.operation.type": "process", "messaging.operation.name": "process",
				"messaging.destination.name": "hooks", "messaging.message.id": attr(send, "messaging.message.id"),
				"pgoutbox.effect.type": "hook.safe", "pgoutbox.attempt": "1", "pgoutbox.outcome": "success",
				"pgoutbox.state": "completed"}
			for k, v := range want {
				if got := attr(process, k); got != v {
					t.Errorf("process span: %s = %q, want %q", k, got, v)
				}
			}
			if process.SpanKind != trace.SpanKindConsumer || len(process.Attributes) != len(want) {
				t.Errorf("process span: kind %s, attributes %v (nothing more than %d, no payload, no key)",
					process.SpanKind, process.Attributes, len(want))
			}

			target := tr.spans(t, "POST /hooks", 1)[0]
			childOf(t, target, process.SpanContext)
			for _, s := range tr.exp.GetSpans() {
				if s.SpanContext.TraceID() != caller.TraceID() {
					t.Errorf("span %q is in trace %s, want %s", s.Name, s.SpanContext.TraceID(), caller.TraceID())
				}
			}
		})
	}
}

// TestRetryLinksToTheEnqueue: the first attempt is a child of the enqueue's
// span; the second is the root of a trace of its own, linked to it (not its
// child), and the target receives each attempt's own traceparent.
func TestRetryLinksToTheEnqueue(t *testing.T) {
	t.Parallel()
	tr := newTraced(t)
	tr.failFor = 1
	tr.request(t, "order-retry")
	tr.deliver(t, 0)

	send := tr.spans(t, "send hooks", 1)[0]
	process := tr.spans(t, "process hooks", 2)
	if attr(process[0], "pgoutbox.attempt") != "1" {
		process[0], process[1] = process[1], process[0]
	}
	first, second := process[0], process[1]
	childOf(t, first, send.SpanContext)
	if attr(first, "pgoutbox.outcome") != "retry" || attr(first, "pgoutbox.state") != "available" ||
		first.Status.Description != "retry" {
		t.Errorf("first attempt: attributes %v, status %v, want outcome retry, state available", first.Attributes, first.Status)
	}
	if second.Parent.IsValid() || second.SpanContext.TraceID() == send.SpanContext.TraceID() {
		t.Errorf("second attempt: parent %v, trace %s; want a new root, not in the enqueue's trace %s",
			second.Parent.SpanID(), second.SpanContext.TraceID(), send.SpanContext.TraceID())
	}
	if len(second.Links) != 1 || second.Links[0].SpanContext.TraceID() != send.SpanContext.TraceID() ||
		second.Links[0].SpanContext.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("second attempt: links %v, want one to the send span", second.Links)
	}
	if attr(second, "pgoutbox.attempt") != "2" || attr(second, "pgoutbox.outcome") != "success" {
		t.Errorf("second attempt: attributes %v", second.Attributes)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.got) != 2 || tr.got[0] != "00-"+first.SpanContext.TraceID().String()+"-"+first.SpanContext.SpanID().String()+"-01" ||
		tr.got[1] != "00-"+second.SpanContext.TraceID().String()+"-"+second.SpanContext.SpanID().String()+"-01" {
		t.Errorf("the target received traceparents %q, want each attempt's span", tr.got)
	}
}
