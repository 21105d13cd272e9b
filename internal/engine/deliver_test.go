package engine_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

func setup(t *testing.T) (*pgxpool.Pool, context.Context) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	if _, err := pool.Exec(ctx, `CREATE TABLE marks (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return pool, ctx
}

func enqueue(t *testing.T, ctx context.Context, pool *pgxpool.Pool, effects ...pgoutbox.Effect) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = pgoutbox.EnqueueBatch(ctx, tx, effects)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// deliverer is the Deliverer as (*pgoutbox.Lease).Deliver builds it; it
// records every failure in PostgreSQL (no hand-back to a broker).
func deliverer(pool *pgxpool.Pool) engine.Deliverer {
	return engine.Deliverer{Pool: pool, BackoffCap: pgoutbox.BackoffCapDefault, Shutdown: errors.New("stopped")}
}

// The completion of an internal job (a TxHandler) commits under a context
// of its own, not under the delivery's: a delivery context cancelled as the
// job returns (a lost lease noticed late, a shutdown) must not turn a fenced
// completion that holds its row into an unrecorded one, and the job's
// writes commit with it. The job cancels the delivery's context itself, so
// the commit always starts with it cancelled.
func TestTxJobCommitsAfterDeliveryCancelled(t *testing.T) {
	t.Parallel()
	pool, ctx := setup(t)
	id := enqueue(t, ctx, pool, pgoutbox.Effect{Queue: "q", Type: "job", Key: "job"})[0]
	claimed, err := store.Claim(ctx, pool, "q", "w", 1, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v (%d)", err, len(claimed))
	}
	cl := claimed[0]
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	j := &engine.Job{
		Fence:   cl.Fence(),
		Attempt: cl.Attempt, MaxAttempts: cl.MaxAttempts, ReplaySafe: true, Timeout: 10 * time.Second,
		TxHandler: func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO marks VALUES ('job')`); err != nil {
				return err
			}
			cancel() // the delivery's context ends as the job returns
			return nil
		},
	}
	d := deliverer(pool)
	if r := d.Run(dctx, j); r.Status != engine.Completed {
		t.Fatalf("job whose delivery context ended at its return: %+v, want Completed", r)
	}
	var state string
	var marks int
	if err := pool.QueryRow(ctx, `SELECT state::text, (SELECT count(*) FROM marks) FROM pgoutbox.effects WHERE id = $1`, id).
		Scan(&state, &marks); err != nil {
		t.Fatal(err)
	}
	if state != "completed" || marks != 1 {
		t.Fatalf("effect %s with %d job writes, want completed with 1", state, marks)
	}
}

// outcomeRow is what a delivery leaves behind, in a form two queues can be
// compared by.
type outcomeRow struct {
	State      string
	Attempts   int
	Started    bool
	LastError  string
	DueMinutes float64 // available_at - now(), rounded to minutes
	Marked     bool    // its OnComplete transition or job write committed
}

func outcomes(t *testing.T, ctx context.Context, pool *pgxpool.Pool, queue string) map[string]outcomeRow {
	t.Helper()
	rows, err := pool.Query(ctx, `
		SELECT idempotency_key, state::text, attempts, delivery_started_at IS NOT NULL, coalesce(last_error, ''),
		       extract(epoch FROM available_at - now())::float8,
		       EXISTS (SELECT 1 FROM marks m WHERE m.key = $1 || ':' || e.idempotency_key)
		FROM pgoutbox.effects e WHERE queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]outcomeRow{}
	for rows.Next() {
		var k string
		var r outcomeRow
		var due float64
		if err := rows.Scan(&k, &r.State, &r.Attempts, &r.Started, &r.LastError, &due, &r.Marked); err != nil {
			t.Fatal(err)
		}
		r.DueMinutes = math.Round(due / 60)
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// A broker consumer delivers through the same Deliverer as a Client (the
// same JobOf and RouteOf, through (*pgoutbox.Lease).Deliver): the
// same effects delivered both ways end in the same rows. Each path runs the
// same handlers on its own queue: "w" by a Client, "r" relayed (a relay
// claim, a take-over) and delivered as adapters/nats does.
func TestRelayedDeliveryMirrorsTheWorker(t *testing.T) {
	t.Parallel()
	pool, ctx := setup(t)
	var mu sync.Mutex
	startedBefore := map[string]bool{} // queue:key of a dispatch → delivery_started_at committed before the call
	mark := func(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO marks VALUES ($1)`, d.Queue+":"+d.Key)
		return err
	}
	types := []pgoutbox.EffectType{
		{Name: "dispatch", Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			var started *time.Time
			if err := pool.QueryRow(ctx, `SELECT delivery_started_at FROM pgoutbox.effects WHERE id = $1`, d.ID).Scan(&started); err != nil {
				return err
			}
			mu.Lock()
			startedBefore[d.Queue+":"+d.Key] = started != nil
			mu.Unlock()
			if d.Key == "ambiguous" {
				return pgoutbox.Ambiguous(errors.New("timeout after sending"))
			}
			return nil
		}},
		{Name: "safe", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			switch d.Key {
			case "retry-after":
				return pgoutbox.RetryAfter(time.Hour, errors.New("429"))
			case "permanent":
				return pgoutbox.Permanent(errors.New("400"))
			case "panic":
				panic("boom")
			}
			d.OnComplete(func(ctx context.Context, tx pgx.Tx) error { return mark(ctx, tx, d) })
			return nil
		}},
		{Name: "job", TxHandler: mark},
	}
	effects := func(queue string) []pgoutbox.Effect {
		return []pgoutbox.Effect{
			{Queue: queue, Type: "dispatch", Key: "ok"},
			{Queue: queue, Type: "dispatch", Key: "ambiguous"},
			{Queue: queue, Type: "safe", Key: "transition"},
			{Queue: queue, Type: "safe", Key: "retry-after"},
			{Queue: queue, Type: "safe", Key: "permanent"},
			{Queue: queue, Type: "safe", Key: "panic", MaxAttempts: 1},
			{Queue: queue, Type: "job", Key: "job"},
			{Queue: queue, Type: "unregistered", Key: "nobody", MaxAttempts: 1},
		}
	}

	// The worker.
	wids := enqueue(t, ctx, pool, effects("w")...)
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"w": {Concurrency: 4}}, Types: types,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := c.Subscribe(64)
	defer unsubscribe()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	workerOutcome := map[int64]string{}
	for len(workerOutcome) < len(wids) {
		select {
		case e := <-events:
			workerOutcome[e.EffectID] = string(e.Outcome)
		case <-ctx.Done():
			t.Fatalf("the worker recorded %d of %d outcomes", len(workerOutcome), len(wids))
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		t.Fatal(err)
	}

	// The relayed path.
	rids := enqueue(t, ctx, pool, effects("r")...)
	ls, err := pgoutbox.ClaimRelayLeases(ctx, pool, "r", "relay-1", 100, time.Minute)
	if err != nil || len(ls) != len(rids) {
		t.Fatalf("relay claim: %v (%d)", err, len(ls))
	}
	msgs := make([]pgoutbox.BrokerMessage, len(ls))
	for i, l := range ls {
		msgs[i] = pgoutbox.BrokerMessage{ID: l.ID, Type: l.Type, Key: l.Key, RelayToken: l.LeaseToken}
	}
	if _, err := pgoutbox.HandOver(ctx, pool, ls, "pgoutbox:handoff", time.Hour); err != nil {
		t.Fatal(err)
	}
	taken, err := pgoutbox.TakeOver(ctx, pool, msgs, "pgoutbox:handoff", "consumer-1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]pgoutbox.EffectType{}
	for _, ty := range types {
		byName[ty.Name] = ty
	}
	// Delivered through the public API (Lease.Deliver), as adapters/nats
	// delivers.
	relayOutcome := map[string]string{}
	for _, tr := range taken {
		if tr.Action != pgoutbox.TakeOverTaken {
			t.Fatalf("take over: %+v", tr)
		}
		l := tr.Lease
		r, err := l.Deliver(ctx, pool, byName[l.Type], pgoutbox.DeliverOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("deliver %s: %v", l.Key, err)
		}
		relayOutcome[l.Key] = string(r.Outcome)
	}

	w, r := outcomes(t, ctx, pool, "w"), outcomes(t, ctx, pool, "r")
	for i, e := range effects("w") {
		k := e.Key
		if w[k] != r[k] {
			t.Errorf("%s: worker %+v, relayed %+v", k, w[k], r[k])
		}
		if workerOutcome[wids[i]] != relayOutcome[k] {
			t.Errorf("%s: worker outcome %s, relayed %s", k, workerOutcome[wids[i]], relayOutcome[k])
		}
	}
	// And the rows are the right ones, not merely equal.
	want := map[string]string{
		"ok": "completed", "ambiguous": "reconciliation_required", "transition": "completed",
		"retry-after": "available", "permanent": "dead_letter", "panic": "dead_letter", "job": "completed",
		"nobody": "dead_letter",
	}
	for k, st := range want {
		if r[k].State != st {
			t.Errorf("relayed %s: %+v, want %s", k, r[k], st)
		}
	}
	if !r["transition"].Marked || !r["job"].Marked || r["retry-after"].DueMinutes < 60 || !r["ambiguous"].Started {
		t.Errorf("relayed: transition %+v, job %+v, retry-after %+v, ambiguous %+v", r["transition"], r["job"], r["retry-after"], r["ambiguous"])
	}
	for _, k := range []string{"w:ok", "w:ambiguous", "r:ok", "r:ambiguous"} {
		if !startedBefore[k] {
			t.Errorf("%s: delivery_started_at was not committed before the handler ran", k)
		}
	}
}
