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
