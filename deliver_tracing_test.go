package pgoutbox_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
)

// spanAttr is the value of attribute k of s, "" when s has none.
func spanAttr(s tracetest.SpanStub, k attribute.Key) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

// TestLeaseDeliverTracing: effects enqueued under a recording span and
// delivered through the manual API ((*Lease).Deliver) each yield a consumer
// span "process q" in the enqueue's trace, a child of its send span, that
// the handler's ctx carries and that ends with the outcome and the state.
func TestLeaseDeliverTracing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, request := tp.Tracer("test").Start(b.ctx, "request")
	ok := b.enqueueCtx(t, ctx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "ok"})
	bad := b.enqueueCtx(t, ctx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "bad"})
	request.End()

	handled := map[int64]trace.SpanContext{}
	typ := pgoutbox.EffectType{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
		handled[d.ID] = trace.SpanContextFromContext(ctx)
		if d.Key == "bad" {
			return pgoutbox.Permanent(errors.New("422"))
		}
		return nil
	}}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "manual", 10, time.Minute)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim: %v (%d leases)", err, len(leases))
	}
	for _, l := range leases {
		if _, err := l.Deliver(b.ctx, b.pool, typ, pgoutbox.DeliverOptions{TracerProvider: tp}); err != nil {
			t.Fatal(err)
		}
	}

	sends := map[string]trace.SpanID{} // message id → its send span
	process := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		id := spanAttr(s, "messaging.message.id")
		switch s.Name {
		case "send q":
			sends[id] = s.SpanContext.SpanID()
		case "process q":
			process[id] = s
		}
	}
	for id, want := range map[int64][2]string{ok: {"success", "completed"}, bad: {"permanent", "dead_letter"}} {
		mid := strconv.FormatInt(id, 10)
		s, found := process[mid]
		switch {
		case !found:
			t.Errorf("effect %d: no process span (spans: %d)", id, len(exp.GetSpans()))
			continue
		case s.SpanKind != trace.SpanKindConsumer:
			t.Errorf("effect %d: span kind %v, want consumer", id, s.SpanKind)
		case s.SpanContext.TraceID() != request.SpanContext().TraceID() || s.Parent.SpanID() != sends[mid]:
			t.Errorf("effect %d: process span in trace %s under %s, want trace %s under its send span %s",
				id, s.SpanContext.TraceID(), s.Parent.SpanID(), request.SpanContext().TraceID(), sends[mid])
		case handled[id].SpanID() != s.SpanContext.SpanID():
			t.Errorf("effect %d: the handler's ctx carries span %s, want the process span %s", id, handled[id].SpanID(), s.SpanContext.SpanID())
		}
		if o, st := spanAttr(s, "pgoutbox.outcome"), spanAttr(s, "pgoutbox.state"); o != want[0] || st != want[1] {
			t.Errorf("effect %d: span ended with outcome %q, state %q; want %q, %q", id, o, st, want[0], want[1])
		}
	}
}
