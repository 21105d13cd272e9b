package pgoutbox

import (
	"context"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/engine"
)

// Tracing (docs/operations.md, "Tracing") follows OpenTelemetry's messaging
// semantic conventions: an enqueue is a PRODUCER span "send <queue>" whose
// W3C traceparent the effect row keeps (migration 00024), and a delivery is
// a CONSUMER span "process <queue>" that continues it. Attributes name the
// queue, the effect's id and type, the attempt and the outcome; never the
// payload, the idempotency key or the ordering key, which may be derived from
// what a payload holds.

// TracerName is the instrumentation scope of pgoutbox's spans.
const TracerName = "github.com/pgoutbox/pgoutbox"

// MessagingSystem is the messaging.system attribute of pgoutbox's spans.
const MessagingSystem = "pgoutbox"

// pgoutbox's own span attributes.
const (
	attrEffectType = attribute.Key("pgoutbox.effect.type")
	attrAttempt    = attribute.Key("pgoutbox.attempt")
)

// w3c reads and writes the traceparent header; the effect row keeps W3C's
// format whatever propagator the application installed globally.
var w3c propagation.TraceContext

// enqueueTracer is the tracer of an enqueue in ctx: the provider of the
// caller's span when it is recording (so a span started with a provider of
// the application's own is continued by it), else the global one
// (otel.GetTracerProvider(): a no-op until the application installs an SDK).
func enqueueTracer(ctx context.Context) trace.Tracer {
	tp := otel.GetTracerProvider()
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		tp = s.TracerProvider()
	}
	return tp.Tracer(TracerName)
}

// enqueueSpan starts the producer span of an enqueue of effects and returns
// the traceparent its effects keep ("" when the span context is not valid:
// no SDK and no incoming trace, so nothing more is written) and the
// function that ends it. A batch is one "send" span that is the creation
// context of all its effects (no "create" span per effect: a batch of
// 1,000 effects costs one span).
func enqueueSpan(ctx context.Context, effects []Effect) (string, func(ids []int64, err error)) {
	queue := effects[0].Queue
	for _, e := range effects[1:] {
		if e.Queue != queue {
			queue = ""
			break
		}
	}
	name := "send"
	if queue != "" {
		name = "send " + queue
	}
	_, span := enqueueTracer(ctx).Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"))
		if queue != "" {
			span.SetAttributes(semconv.MessagingDestinationName(queue))
		}
		if len(effects) > 1 {
			span.SetAttributes(semconv.MessagingBatchMessageCount(len(effects)))
		} else {
			span.SetAttributes(attrEffectType.String(effects[0].Type))
		}
	}
	tp := traceparentOf(span.SpanContext())
	return tp, func(ids []int64, err error) {
		if err != nil {
			span.SetStatus(codes.Error, "enqueue failed")
			span.SetAttributes(semconv.ErrorTypeKey.String(fmt.Sprintf("%T", err)))
		} else if len(ids) == 1 && span.IsRecording() {
			span.SetAttributes(semconv.MessagingMessageID(strconv.FormatInt(ids[0], 10)))
		}
		span.End()
	}
}

// traceparentOf is sc as a W3C traceparent, "" when sc is not valid.
func traceparentOf(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"]
}

// spanContextOf parses a stored traceparent; the zero SpanContext (not
// valid) for "" or a malformed one.
func spanContextOf(traceparent string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	ctx := w3c.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	return trace.SpanContextFromContext(ctx)
}

// deliverySpan starts d's consumer span "process <queue>" in ctx with the
// Client's tracer (startDeliverySpan).
func (c *Client) deliverySpan(ctx context.Context, d *Delivery, traceparent string) context.Context {
	name := ""
	if q := c.queues[d.Queue]; q != nil {
		name = q.spanName
	}
	return startDeliverySpan(ctx, c.tracer, name, d, traceparent)
}

// consumerSpan is the options of a delivery's span with no stored
// traceparent: shared, so that a delivery does not allocate them.
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// startDeliverySpan starts d's consumer span name ("process <queue>" when
// "") in ctx with tracer and keeps it in d, for engine.EndSpan: the one
// span of a delivery, whether a Client or (*Lease).Deliver makes it. The
// first attempt is a child of the enqueue's span (the stored traceparent);
// a later one starts a trace of its own, so that retries hours apart are
// not one long trace. Every attempt links to the enqueue's span (the
// conventions' creation context).
func startDeliverySpan(ctx context.Context, tracer trace.Tracer, name string, d *Delivery, traceparent string) context.Context {
	if name == "" {
		name = "process " + d.Queue
	}
	opts := consumerSpan
	if sc := spanContextOf(traceparent); sc.IsValid() {
		opts = []trace.SpanStartOption{consumerSpan[0], trace.WithLinks(trace.Link{SpanContext: sc})}
		if d.Attempt <= 1 {
			ctx = trace.ContextWithRemoteSpanContext(ctx, sc)
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
	}
	ctx, span := tracer.Start(ctx, name, opts...)
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(d.Queue), semconv.MessagingMessageID(strconv.FormatInt(d.ID, 10)),
			attrEffectType.String(d.Type), attrAttempt.Int(d.Attempt))
	}
	engine.SetSpan(d, span)
	return ctx
}

// pageSpan starts the consumer span "process <queue>" of one PageHandler
// call in ctx with the Client's tracer: a span of its own (the effects may
// come from many traces), linked to each enqueue's span (the conventions'
// batch receive), with the batch's message count.
func (c *Client) pageSpan(ctx context.Context, queue, typ string, ds []*Delivery, traceparents []string) (context.Context, trace.Span) {
	name := "process " + queue
	if q := c.queues[queue]; q != nil {
		name = q.spanName
	}
	opts := []trace.SpanStartOption{consumerSpan[0], trace.WithNewRoot()}
	var links []trace.Link
	for _, tp := range traceparents {
		if sc := spanContextOf(tp); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if len(links) > 0 {
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := c.tracer.Start(ctx, name, opts...)
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String(MessagingSystem),
			semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(queue), semconv.MessagingBatchMessageCount(len(ds)),
			attrEffectType.String(typ))
	}
	return ctx, span
}

// endPageSpan ends a PageHandler call's span: an error status with how many
// of its deliveries failed, when any did.
func endPageSpan(span trace.Span, errs []error) {
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if failed > 0 && span.IsRecording() {
		span.SetStatus(codes.Error, strconv.Itoa(failed)+" of "+strconv.Itoa(len(errs))+" deliveries failed")
	}
	span.End()
}
