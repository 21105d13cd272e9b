package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// A program that claims effects itself (a cron drain, a batch job) delivers
// each lease as a Client would: the handler under its timeout and a panic
// guard, the classified outcome recorded, fenced by the lease.
func ExampleLease_Deliver() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "mail", Type: "mail.send", Key: "order-42"},
			{Queue: "mail", Type: "mail.send", Key: "order-43"},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	send := pgoutbox.EffectType{Name: "mail.send", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
		if d.Key == "order-43" {
			return pgoutbox.Permanent(errors.New("550 no such mailbox"))
		}
		return nil
	}}
	leases, err := pgoutbox.ClaimLeases(ctx, pool, "mail", "cron-drain", 10, time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range leases {
		r, err := l.Deliver(ctx, pool, send, pgoutbox.DeliverOptions{Timeout: 10 * time.Second})
		if err != nil { // ErrLeaseLost, or a *RecordError: the sweeper recovers it
			log.Fatal(err)
		}
		fmt.Println(l.Key, r.Outcome, r.State)
	}
	// Output:
	// order-42 success completed
	// order-43 permanent dead_letter
}

// A target that takes many documents in one request (a search index's
// bulk update) registers a PageHandler: a batch queue hands it a page's
// effects of its type in one call, and each delivery's error is its own.
func ExamplePageHandler() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()
	// The queue's storage is recorded before the enqueue, so that the
	// effects go to the stream (a starting Client records it too).
	if err := pgoutbox.SetStorage(ctx, pool, "index", pgoutbox.StorageBatch); err != nil {
		log.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "index", Type: "record.index", Key: "record-1"},
			{Queue: "index", Type: "record.index", Key: "record-2"},
			{Queue: "index", Type: "record.index", Key: "record-3"},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	index := pgoutbox.EffectType{Name: "record.index", ReplaySafe: true,
		PageHandler: func(_ context.Context, ds []*pgoutbox.Delivery) []error {
			fmt.Println("one bulk request of", len(ds), "documents")
			return nil // all indexed; else one error per delivery, in order
		}}
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"index": {Storage: pgoutbox.StorageBatch}},
		Types:  []pgoutbox.EffectType{index},
	})
	if err != nil {
		log.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(8)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()
	for range 3 {
		e := next(events)
		if e.Outcome != pgoutbox.OutcomeSuccess {
			log.Fatal(e)
		}
	}
	// Output:
	// one bulk request of 3 documents
}
