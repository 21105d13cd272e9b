package pgoutbox_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// This example enqueues an effect in the transaction that changes the
// application's state, and runs a client that delivers it.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Write the state change and the effect together.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, 42); err != nil {
			return err
		}
		_, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
			Queue:   "emails",
			Type:    "email.receipt",
			Key:     pgoutbox.Key("email.receipt", "42"),
			Payload: map[string]any{"order_id": 42},
		})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	// Deliver it.
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"emails": {Concurrency: 10}},
		Types: []pgoutbox.EffectType{{
			Name:       "email.receipt",
			ReplaySafe: true, // the mail service dedups by the idempotency key
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				fmt.Println("send receipt", d.Key)
				return nil // or pgoutbox.Retry / RetryAfter / Permanent / Ambiguous
			},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()
}
