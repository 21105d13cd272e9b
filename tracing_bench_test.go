package pgoutbox

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgoutbox/pgoutbox/internal/engine"
)

// BenchmarkDeliverySpan measures what tracing adds to one delivery: its
// consumer span started and ended, with no provider (the default: the
// global one, a no-op without an SDK) and with the SDK recording into an
// in-memory exporter, each without and with a stored traceparent (ns/op and
// allocs/op; nothing is asserted). A delivery costs a claim, a handler and a
// completion besides: compare with BenchmarkDrain's effects/s.
// Run: go test -run '^$' -bench DeliverySpan -benchmem .
func BenchmarkDeliverySpan(b *testing.B) {
	exp := tracetest.NewInMemoryExporter()
	sdk := trace.NewTracerProvider(trace.WithSyncer(exp))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name   string
		client *Client
		parent string
	}{
		{"noop", &Client{tracer: noop.NewTracerProvider().Tracer(TracerName)}, ""},
		{"noop/traceparent", &Client{tracer: noop.NewTracerProvider().Tracer(TracerName)}, tp},
		{"sdk", &Client{tracer: sdk.Tracer(TracerName)}, ""},
		{"sdk/traceparent", &Client{tracer: sdk.Tracer(TracerName)}, tp},
	} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for range b.N {
				d := &Delivery{ID: 1, Queue: "bulk", Type: "noop", Attempt: 1}
				_ = c.client.deliverySpan(ctx, d, c.parent)
				engine.EndSpan(d, OutcomeSuccess, StateCompleted)
				exp.Reset()
			}
		})
	}
}
