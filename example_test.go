package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The examples run under go test against a real PostgreSQL: exampleDB
// gives each one a fresh database migrated like migrations.Up leaves an
// application's, from the test harness (internal/pgtest), so that their
// Output is checked.

// exampleDB opens a pool on a fresh migrated database with an orders table;
// done closes the pool and drops the database.
func exampleDB(ctx context.Context) (pool *pgxpool.Pool, done func()) {
	dsn, drop := pgtest.ExampleDB()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, state text NOT NULL, charge_id text);
		INSERT INTO orders (id, state) VALUES (42, 'new')`); err != nil {
		log.Fatal(err)
	}
	return pool, func() { pool.Close(); drop() }
}

// next returns the next event of a subscription; it panics, failing the
// example, when none arrives within a minute.
func next(events <-chan pgoutbox.Event) pgoutbox.Event {
	select {
	case e := <-events:
		return e
	case <-time.After(time.Minute):
		panic("no delivery outcome within a minute")
	}
}

// deliver starts a client with cfg, subscribed to its events, and enqueues
// e in a transaction of its own (Example shows each step); stop stops the
// client.
func deliver(ctx context.Context, pool *pgxpool.Pool, cfg pgoutbox.Config, e pgoutbox.Effect) (events <-chan pgoutbox.Event, stop func()) {
	client, err := pgoutbox.NewClient(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(16)
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.Enqueue(ctx, tx, e)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	return events, func() { _ = client.Stop(ctx); unsubscribe() }
}

// This example enqueues an effect in the transaction that changes the
// application's state, and runs a client that delivers it.
func Example() {
	ctx := context.Background()
	// pool is the application's pgx pool, on a database migrated with
	// migrations.Up.
	pool, done := exampleDB(ctx)
	defer done()

	// Write the state change and the effect together: the effect exists
	// if and only if the order is paid.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
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
				var p struct {
					OrderID int `json:"order_id"`
				}
				if err := json.Unmarshal(d.Payload, &p); err != nil {
					return pgoutbox.Permanent(err) // retrying cannot fix a bad payload
				}
				fmt.Printf("send receipt for order %d (attempt %d)\n", p.OrderID, d.Attempt)
				return nil // or pgoutbox.Retry / RetryAfter / Permanent / Ambiguous
			},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(16)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = client.Stop(ctx) }()

	e := next(events)
	fmt.Println(e.Type, e.Outcome, e.State)
	// Output:
	// send receipt for order 42 (attempt 1)
	// email.receipt success completed
}

// Enqueue is idempotent per queue and key, and an effect exists only if its
// transaction commits.
func ExampleEnqueue() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	receipt := pgoutbox.Effect{
		Queue: "emails", Type: "email.receipt",
		Key:     pgoutbox.Key("email.receipt", "42"),
		Payload: map[string]any{"order_id": 42},
	}
	enqueue := func(e pgoutbox.Effect, commit bool) (id int64) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if id, err = pgoutbox.Enqueue(ctx, tx, e); err != nil {
				return err
			}
			if !commit {
				return errors.New("payment declined") // rolls back, effect included
			}
			return nil
		})
		if err != nil && commit {
			log.Fatal(err)
		}
		return id
	}
	first := enqueue(receipt, true)
	second := enqueue(receipt, true) // same key: the existing effect's id, nothing written
	fmt.Println("same effect:", first == second)

	other := receipt
	other.Key = pgoutbox.Key("email.receipt", "43")
	enqueue(other, false)

	rows, err := pgoutbox.ListEffects(ctx, pool, pgoutbox.StateAvailable, "emails", 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("effects waiting:", len(rows))
	// Output:
	// same effect: true
	// effects waiting: 1
}

// Invalid input is refused with a typed error before anything is written.
func ExampleCredentialKeyError() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
			Queue: "webhooks", Type: "webhook.post", Key: "order-42",
			Payload: map[string]any{"url": "https://example.com/hook", "headers": map[string]string{"Authorization": "Bearer …"}},
		})
		return err
	})
	var ce *pgoutbox.CredentialKeyError
	if errors.As(err, &ce) {
		fmt.Println("refused:", ce.Path)
	}
	fmt.Println(errors.Is(err, pgoutbox.ErrCredentialKey))
	// Output:
	// refused: $.headers.Authorization
	// true
}

// A handler classifies a failure by the error it returns: here the target
// is rate-limited on the first attempt and asks to be called again later.
func ExampleRetryAfter() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"search": {}},
		Types: []pgoutbox.EffectType{{
			Name: "search.index", ReplaySafe: true,
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				if d.Attempt == 1 {
					// e.g. an HTTP 429 with Retry-After: 0.02
					return pgoutbox.RetryAfter(20*time.Millisecond, errors.New("429 Too Many Requests"))
				}
				return nil
			},
		}},
		BackoffCap: time.Millisecond, // so that the Retry-After decides the delay
	}
	events, stop := deliver(ctx, pool, cfg, pgoutbox.Effect{Queue: "search", Type: "search.index", Key: "order-42"})
	defer stop()
	for range 2 {
		e := next(events)
		fmt.Println("attempt", e.Attempt, e.Outcome, e.State, e.Err)
	}
	// Output:
	// attempt 1 retry_after available 429 Too Many Requests (retry after 20ms)
	// attempt 2 success completed
}

// OnComplete commits the application's own writes with the effect's
// completion: here the charge id the payment provider returned.
func ExampleDelivery_OnComplete() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"payments": {}},
		Types: []pgoutbox.EffectType{{
			Name: "payment.capture", ReplaySafe: true, // the provider dedups by the key
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				chargeID := "ch_" + d.Key // what the provider answered
				d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `UPDATE orders SET charge_id = $1 WHERE id = 42`, chargeID)
					return err
				})
				return nil
			},
		}},
	}
	events, stop := deliver(ctx, pool, cfg, pgoutbox.Effect{Queue: "payments", Type: "payment.capture", Key: "order-42"})
	defer stop()
	fmt.Println(next(events).State)
	var chargeID string
	if err := pool.QueryRow(ctx, `SELECT charge_id FROM orders WHERE id = 42`).Scan(&chargeID); err != nil {
		log.Fatal(err)
	}
	fmt.Println(chargeID)
	// Output:
	// completed
	// ch_order-42
}

// An effect type that is not replay-safe is never sent twice on its own: an
// unknown outcome parks it in reconciliation_required until an operator
// finds out what happened and resolves it.
func ExampleResolve() {
	ctx := context.Background()
	pool, done := exampleDB(ctx)
	defer done()

	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"payments": {}},
		Types: []pgoutbox.EffectType{{
			Name: "payment.transfer", ReplaySafe: false, // the bank has no idempotency key
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				return pgoutbox.Ambiguous(errors.New("connection reset after the request was sent"))
			},
		}},
	}
	events, stop := deliver(ctx, pool, cfg, pgoutbox.Effect{Queue: "payments", Type: "payment.transfer", Key: "order-42"})
	defer stop()
	e := next(events)
	fmt.Println(e.Outcome, e.State)

	// The operator's side: list what needs a decision, check with the bank,
	// record the answer in the transaction that acts on it.
	pending, err := pgoutbox.ListEffects(ctx, pool, pgoutbox.StateReconciliationRequired, "payments", 100)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range pending {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return pgoutbox.Resolve(ctx, tx, r.ID, r.Type, map[string]string{"bank": "transfer executed"})
		})
		if err != nil {
			log.Fatal(err)
		}
		after, _, err := pgoutbox.GetEffect(ctx, pool, r.ID)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(r.Type, r.State, "→", after.State)
	}
	// Output:
	// ambiguous reconciliation_required
	// payment.transfer reconciliation_required → completed
}

func ExampleKey() {
	// The same parts always give the same key, so a retried request that
	// enqueues again finds the effect it already wrote.
	first, again := pgoutbox.Key("email.receipt", "42"), pgoutbox.Key("email.receipt", "42")
	fmt.Println(first == again, len(first))
	fmt.Println(first == pgoutbox.Key("email.receipt", "43"))
	// Output:
	// true 64
	// false
}

func ExampleIsCredentialKey() {
	for _, k := range []string{"apiKey", "access_token", "author", "session_name"} {
		fmt.Println(k, pgoutbox.IsCredentialKey(k))
	}
	// Output:
	// apiKey true
	// access_token true
	// author false
	// session_name false
}
