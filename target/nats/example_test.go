package nats_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/target/nats"
)

// Relaying a queue through JetStream: a relay publishes its effects, and
// consumers (here in the same process; usually on other machines) deliver
// them with the same handlers as in-process workers. Relay and consumers
// share the retry policy, whose horizon the stream's duplicate window must
// cover.
func Example_relay() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	nc, err := natsgo.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	policy := pgnats.RetryPolicy{} // 8 attempts, 5 min backoff cap, 60 s lease

	relay, err := pgnats.NewRelay(pool, js, pgnats.RelayConfig{Queues: []string{"outbox_events"}, Retry: policy})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil { // refuses a stream whose duplicate window is too short
		log.Fatal(err)
	}
	defer func() { _ = relay.Stop(ctx) }()

	consumer, err := pgnats.NewConsumer(pool, js, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"outbox_events": {Concurrency: 32}},
		Types: []pgoutbox.EffectType{{Name: "record.upsert", ReplaySafe: true,
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error { return nil }}},
		Retry: policy,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = consumer.Stop(sctx)
	}()
	// ... run until shutdown. A pgoutbox.Client (or `pgoutbox work`) must
	// run the sweeper somewhere: it recovers relay and consumer leases.
}

// The nats.publish effect type: enqueue in the business transaction, and a
// worker publishes with Nats-Msg-Id = the idempotency key.
func ExamplePublishEffect() {
	e, err := pgnats.PublishEffect("outbox_events", "orders.created", map[string]any{"order": 42},
		pgoutbox.Key("orders.created", "42"))
	if err != nil {
		log.Fatal(err)
	}
	_ = e // pgoutbox.Enqueue(ctx, tx, e) inside the transaction that created order 42
	// A Client registers the type with: Types: []pgoutbox.EffectType{pgnats.PublishType(js)}
}
