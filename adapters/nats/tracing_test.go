package nats_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
)

// TestRelayConsumerTracing: an effect enqueued under a recording span is
// relayed with its traceparent as a message header, and the consumer's
// delivery is a consumer span in the enqueue's trace (a child of its send
// span) that the handler's ctx carries, ended with the outcome; an effect
// enqueued without a trace is relayed without the header.
func TestRelayConsumerTracing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	ctx, request := tp.Tracer("test").Start(b.ctx, "request")
	var traced int64
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		traced, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "traced"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	request.End()
	untraced := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "untraced"})[0]
	var send tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "send q" {
			send = s
		}
	}
	wantTP := "00-" + send.SpanContext.TraceID().String() + "-" + send.SpanContext.SpanID().String() + "-01"

	sub, err := b.nc.SubscribeSync("pgoutbox.q.>") // sees what the relay publishes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	handled := make(chan trace.SpanContext, 2)
	types := []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
		if d.Key == "traced" {
			handled <- trace.SpanContextFromContext(ctx)
		}
		return nil
	}}}
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: testPolicy})

	headers := map[string]natsgo.Header{}
	for len(headers) < 2 {
		m, err := sub.NextMsgWithContext(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		headers[m.Header.Get(pgnats.HeaderEffectID)] = m.Header
	}
	if got := headers[strconv.FormatInt(traced, 10)].Get(pgnats.HeaderTraceparent); got != wantTP {
		t.Errorf("traced effect relayed with traceparent header %q, want its send span's %q", got, wantTP)
	}
	if h, found := headers[strconv.FormatInt(untraced, 10)][pgnats.HeaderTraceparent]; found {
		t.Errorf("untraced effect relayed with traceparent header %q, want none", h)
	}

	b.startConsumer(t, pgnats.ConsumerConfig{Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Types: types,
		Retry: testPolicy, AckWait: time.Second, TracerProvider: tp})
	var sc trace.SpanContext
	select {
	case sc = <-handled:
	case <-b.ctx.Done():
		t.Fatal("the traced effect was not delivered")
	}
	var process tracetest.SpanStub
	b.waitFor(t, "the traced effect's process span to end", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "process q" && s.SpanContext.SpanID() == sc.SpanID() {
				process = s
				return true
			}
		}
		return false
	})
	if process.SpanKind != trace.SpanKindConsumer || process.SpanContext.TraceID() != send.SpanContext.TraceID() ||
		process.Parent.SpanID() != send.SpanContext.SpanID() {
		t.Errorf("process span: kind %v in trace %s under %s, want a consumer span in trace %s under the send span %s",
			process.SpanKind, process.SpanContext.TraceID(), process.Parent.SpanID(), send.SpanContext.TraceID(), send.SpanContext.SpanID())
	}
	outcome := ""
	for _, a := range process.Attributes {
		if a.Key == attribute.Key("pgoutbox.outcome") {
			outcome = a.Value.Emit()
		}
	}
	if outcome != "success" {
		t.Errorf("process span ended with outcome %q, want success", outcome)
	}
}
