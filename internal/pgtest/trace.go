package pgtest

import (
	"context"
	"strconv"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Traced is an OpenTelemetry SDK tracer provider that keeps every ended
// span in memory, for the tests of pgoutbox's spans (docs/operations.md,
// "Tracing").
type Traced struct {
	Provider *sdktrace.TracerProvider
	Exporter *tracetest.InMemoryExporter
}

// NewTraced returns a Traced shut down when the test ends.
func NewTraced(tb testing.TB) *Traced {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Traced{Provider: tp, Exporter: exp}
}

// Start starts a recording span "request" in ctx: an effect enqueued under
// the returned context continues it.
func (tr *Traced) Start(ctx context.Context) (context.Context, trace.Span) {
	return tr.Provider.Tracer("test").Start(ctx, "request")
}

// SpanAttr is the value of attribute key of s as text, "" when s has none.
func SpanAttr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// Find returns the ended span named name whose messaging.message.id is
// effect id.
func (tr *Traced) Find(name string, id int64) (tracetest.SpanStub, bool) {
	for _, s := range tr.Exporter.GetSpans() {
		if s.Name == name && SpanAttr(s, "messaging.message.id") == strconv.FormatInt(id, 10) {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

// CheckDelivery fails tb unless effect id, enqueued alone into queue, has
// an ended CONSUMER span "process <queue>" (its first attempt) that is a
// child of its "send <queue>" span and ended with outcome and state
// (pgoutbox.outcome, pgoutbox.state); it returns the process span.
func (tr *Traced) CheckDelivery(tb testing.TB, queue string, id int64, outcome, state string) tracetest.SpanStub {
	tb.Helper()
	send, sent := tr.Find("send "+queue, id)
	s, found := tr.Find("process "+queue, id)
	switch {
	case !sent || !found:
		tb.Errorf("effect %d: send span found %v, process span found %v (%d spans)", id, sent, found, len(tr.Exporter.GetSpans()))
	case s.SpanKind != trace.SpanKindConsumer:
		tb.Errorf("effect %d: process span kind %v, want consumer", id, s.SpanKind)
	case s.SpanContext.TraceID() != send.SpanContext.TraceID() || s.Parent.SpanID() != send.SpanContext.SpanID():
		tb.Errorf("effect %d: process span in trace %s under %s, want trace %s under its send span %s",
			id, s.SpanContext.TraceID(), s.Parent.SpanID(), send.SpanContext.TraceID(), send.SpanContext.SpanID())
	}
	if o, st := SpanAttr(s, "pgoutbox.outcome"), SpanAttr(s, "pgoutbox.state"); o != outcome || st != state {
		tb.Errorf("effect %d: process span ended with outcome %q, state %q; want %q, %q", id, o, st, outcome, state)
	}
	return s
}
