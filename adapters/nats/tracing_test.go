package nats_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestRelayConsumerTracing: an effect enqueued under a recording span is
// relayed with its traceparent as a message header, and the consumer's
// delivery is a consumer span in the enqueue's trace (a child of its send
// span), ended with the outcome; an effect enqueued without a trace is
// relayed without the header.
func TestRelayConsumerTracing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tr := pgtest.NewTraced(t)
	ctx, request := tr.Start(b.ctx)
	var traced int64
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		traced, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "traced"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	request.End()
	untraced := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "untraced"})[0]
	send, _ := tr.Find("send q", traced)
	wantTP := "00-" + send.SpanContext.TraceID().String() + "-" + send.SpanContext.SpanID().String() + "-01"

	sub, err := b.nc.SubscribeSync("pgoutbox.q.>") // sees what the relay publishes
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
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

	types := []pgoutbox.EffectType{{Name: "t", ReplaySafe: true,
		Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}}
	b.startConsumer(t, pgnats.ConsumerConfig{Queues: map[string]pgoutbox.QueueConfig{"q": {}}, Types: types,
		Retry: testPolicy, AckWait: time.Second, TracerProvider: tr.Provider})
	b.waitFor(t, "the traced effect's process span to end", func() bool {
		_, found := tr.Find("process q", traced)
		return found
	})
	tr.CheckDelivery(t, "q", traced, "success", "completed")
}
