package nats_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The examples run under go test against a real PostgreSQL (a fresh
// migrated database from the test harness, internal/pgtest) and an embedded
// NATS server with JetStream, so that their Output is checked.

// exampleDB opens a pool on a fresh migrated database; done closes the pool
// and drops the database.
func exampleDB(ctx context.Context) (pool *pgxpool.Pool, done func()) {
	dsn, drop := pgtest.ExampleDB()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); drop() }
}

// exampleNATS starts an embedded NATS server with JetStream (file storage in
// a temporary directory), connects to it and returns the JetStream context
// and the function that closes the connection and stops the server.
func exampleNATS() (js jetstream.JetStream, stop func()) {
	dir, err := os.MkdirTemp("", "pgoutbox-nats-example-")
	if err != nil {
		log.Fatal(err)
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(20 * time.Second) {
		log.Fatal("embedded NATS server not ready")
	}
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	if js, err = jetstream.New(nc); err != nil {
		log.Fatal(err)
	}
	return js, func() {
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

// Relaying a queue through JetStream: a relay publishes its effects, and
// consumers (here in the same process; usually on other machines) deliver
// them with the same handlers as in-process workers. Relay and consumers
// share the retry policy, whose horizon the stream's duplicate window must
// cover.
func Example_relay() {
	ctx := context.Background()
	// pool is the application's pgx pool, on a database migrated with
	// migrations.Up; js is a JetStream context (jetstream.New on a
	// connection to a NATS server with JetStream enabled).
	pool, done := exampleDB(ctx)
	defer done()
	js, stopNATS := exampleNATS()
	defer stopNATS()
	policy := pgnats.RetryPolicy{} // 8 attempts, 5 min backoff cap, 60 s lease

	relay, err := pgnats.NewRelay(pool, js, pgnats.RelayConfig{Queues: []string{"outbox_events"}, Retry: policy})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil { // creates the stream; refuses one whose duplicate window is too short
		log.Fatal(err)
	}
	defer func() { _ = relay.Stop(ctx) }()

	delivered := make(chan string, 1)
	consumer, err := pgnats.NewConsumer(pool, js, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"outbox_events": {Concurrency: 32}},
		Types: []pgoutbox.EffectType{{Name: "record.upsert", ReplaySafe: true,
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				delivered <- fmt.Sprintf("%s, attempt %d: %s", d.Type, d.Attempt, d.Payload)
				return nil
			}}},
		Retry: policy,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// A pgoutbox.Client (or `pgoutbox work`) must run the sweeper
	// somewhere: it recovers relay and consumer leases.

	// The application enqueues as always, in its own transaction.
	var id int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
			Queue: "outbox_events", Type: "record.upsert", Key: pgoutbox.Key("record", "42"),
			Payload: map[string]any{"record": 42},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	select {
	case d := <-delivered:
		fmt.Println(d)
	case <-time.After(time.Minute):
		panic("not delivered within a minute")
	}
	// Stop waits (here up to 30 s) for the deliveries in flight to be
	// recorded.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := consumer.Stop(sctx); err != nil {
		log.Fatal(err)
	}
	row, _, err := pgoutbox.GetEffect(ctx, pool, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(row.State)
	// Output:
	// record.upsert, attempt 1: {"record": 42}
	// completed
}

// The nats.publish effect type: enqueue in the business transaction, and a
// worker publishes with Nats-Msg-Id = the idempotency key.
func ExamplePublishEffect() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	js, stopNATS := exampleNATS()
	defer stopNATS()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Hour})
	if err != nil {
		log.Fatal(err)
	}

	// Inside the transaction that created order 42.
	key := pgoutbox.Key("orders.created", "42")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		e, err := pgnats.PublishEffect("outbox_events", "orders.created", map[string]any{"order": 42}, key)
		if err != nil {
			return err
		}
		_, err = pgoutbox.Enqueue(ctx, tx, e)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// A Client delivers it with the registered nats.publish type.
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"outbox_events": {}},
		Types:  []pgoutbox.EffectType{pgnats.PublishType(js)},
	})
	if err != nil {
		log.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(1)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	select {
	case e := <-events:
		fmt.Println(e.Type, e.State)
	case <-time.After(time.Minute):
		panic("not delivered within a minute")
	}

	msg, err := stream.GetLastMsgForSubject(ctx, "orders.created")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(msg.Subject, string(msg.Data))
	fmt.Println("Nats-Msg-Id is the idempotency key:", msg.Header.Get(jetstream.MsgIDHeader) == key)
	// Output:
	// nats.publish completed
	// orders.created {"order": 42}
	// Nats-Msg-Id is the idempotency key: true
}
