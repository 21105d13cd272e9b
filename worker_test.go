package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// outcomeTypes registers one replay-safe and one non-replay-safe type whose
// handler returns what the payload's "do" field says.
func outcomeTypes(calls *atomic.Int64) []pgoutbox.EffectType {
	h := func(_ context.Context, d *pgoutbox.Delivery) error {
		calls.Add(1)
		var p struct{ Do string }
		_ = jsonUnmarshal(d.Payload, &p)
		switch p.Do {
		case "ok":
			return nil
		case "retry":
			return pgoutbox.Retry(errors.New("transient"))
		case "retry_after":
			return pgoutbox.RetryAfter(7*time.Second, errors.New("429 Retry-After: 7"))
		case "permanent":
			return pgoutbox.Permanent(errors.New("422"))
		case "ambiguous":
			return pgoutbox.Ambiguous(errors.New("reset after send"))
		case "plain":
			return errors.New("unclassified")
		case "panic":
			panic("boom")
		}
		return fmt.Errorf("unknown do %q", p.Do)
	}
	return []pgoutbox.EffectType{
		{Name: "safe", ReplaySafe: true, Handler: h},
		{Name: "unsafe", ReplaySafe: false, Handler: h},
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		typ, do     string
		maxAttempts int
		state       string
		attempts    int
		started     bool
		minDelay    float64 // seconds until available_at, database clock
	}{
		{"safe", "ok", 0, "completed", 1, false, 0},
		{"unsafe", "ok", 0, "completed", 1, true, 0},
		{"safe", "retry", 0, "available", 1, false, 1.5}, // 2^1 s ± 10 %
		{"unsafe", "retry", 0, "available", 1, false, 1.5},
		{"safe", "retry_after", 0, "available", 1, false, 6.5},
		{"safe", "permanent", 0, "dead_letter", 1, false, 0},
		{"unsafe", "permanent", 0, "dead_letter", 1, true, 0},
		{"safe", "ambiguous", 0, "available", 1, false, 1.5},
		{"unsafe", "ambiguous", 0, "reconciliation_required", 1, true, 0},
		{"safe", "plain", 0, "available", 1, false, 1.5},
		{"unsafe", "plain", 0, "reconciliation_required", 1, true, 0},
		{"unsafe", "panic", 0, "reconciliation_required", 1, true, 0},
		{"safe", "panic", 0, "available", 1, false, 1.5},
		{"safe", "retry", 1, "dead_letter", 1, false, 0},
		{"unsafe", "ambiguous", 1, "reconciliation_required", 1, true, 0},
	}
	for _, tc := range cases {
		for _, mode := range leaseModes {
			t.Run(fmt.Sprintf("%s_%s_%s_max%d", mode.name, tc.typ, tc.do, tc.maxAttempts), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				var calls atomic.Int64
				c := b.startClient(t, pgoutbox.Config{
					Queues:     map[string]pgoutbox.QueueConfig{"q": {Concurrency: 2, RowLockLease: mode.hold}},
					Types:      outcomeTypes(&calls),
					BackoffCap: time.Hour, // real backoff: the effect must not be retried during the test
				})
				events := watch(t, c)
				id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: tc.typ, Key: "k", MaxAttempts: tc.maxAttempts,
					Payload: map[string]any{"do": tc.do}})[0]
				b.waitEvent(t, events, id, tc.state)
				r := b.row(t, id)
				if r.State != tc.state || r.Attempts != tc.attempts {
					t.Fatalf("state %s attempts %d, want %s %d", r.State, r.Attempts, tc.state, tc.attempts)
				}
				if (r.Started != nil) != tc.started {
					t.Fatalf("delivery_started_at set = %v, want %v", r.Started != nil, tc.started)
				}
				if r.Token != nil || r.Expires != nil {
					t.Fatal("lease not cleared")
				}
				if tc.minDelay > 0 && r.AvailableIn < tc.minDelay {
					t.Fatalf("available in %.2fs, want at least %.1fs", r.AvailableIn, tc.minDelay)
				}
				if tc.state != "completed" && (r.LastError == nil || *r.LastError == "") {
					t.Fatal("last_error not recorded")
				}
				// A retried effect may legitimately run again once its backoff
				// passes; every other outcome must have called the handler once.
				if tc.state != "available" && calls.Load() != 1 {
					t.Fatalf("handler called %d times, want 1", calls.Load())
				}
			})
		}
	}
}

// leaseModes runs a test under durable leases and under row-lock leases
// (QueueConfig.RowLockLease): the outcomes must not differ.
var leaseModes = []struct {
	name string
	hold time.Duration
}{{"durable", pgoutbox.RowLockLeaseOff}, {"rowlock", 5 * time.Second}}

func TestRetryThenSuccessAndDeadLetterAtExactlyMaxAttempts(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testRetryThenSuccess(t, mode.hold)
		})
	}
}

func testRetryThenSuccess(t *testing.T, hold time.Duration) {
	b := setup(t)
	var flakyCalls, poisonCalls atomic.Int64
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4, RowLockLease: hold}},
		Types: []pgoutbox.EffectType{
			{Name: "flaky", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
				if flakyCalls.Add(1) < 3 {
					return errors.New("not yet")
				}
				return nil
			}},
			{Name: "poison", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
				poisonCalls.Add(1)
				return errors.New("always fails")
			}},
		},
	})
	events := watch(t, c)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "flaky", Key: "f"},
		pgoutbox.Effect{Queue: "q", Type: "poison", Key: "p", MaxAttempts: 5},
	)
	b.waitEvent(t, events, ids[0], "completed")
	b.waitEvent(t, events, ids[1], "dead_letter")
	if r := b.row(t, ids[0]); r.Attempts != 3 || r.State != "completed" {
		t.Fatalf("flaky: %+v", r)
	}
	if r := b.row(t, ids[1]); r.Attempts != 5 || poisonCalls.Load() != 5 {
		t.Fatalf("poison: attempts %d, calls %d, want 5 and 5", r.Attempts, poisonCalls.Load())
	}
}

func TestPoisonDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var okCalls atomic.Int64
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4}},
		Types: []pgoutbox.EffectType{
			{Name: "ok", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { okCalls.Add(1); return nil }},
			{Name: "poison", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { return errors.New("poison") }},
		},
	})
	events := watch(t, c)
	effects := []pgoutbox.Effect{{Queue: "q", Type: "poison", Key: "poison", MaxAttempts: 8}}
	for i := range 1000 {
		effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "ok", Key: fmt.Sprint(i)})
	}
	ids := b.enqueue(t, effects...)
	b.waitEvent(t, events, ids[0], "dead_letter")
	b.waitFor(t, "1000 completions", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`) == 1000
	})
	if r := b.row(t, ids[0]); r.Attempts != 8 {
		t.Fatalf("poison attempts %d, want exactly 8", r.Attempts)
	}
	if okCalls.Load() != 1000 {
		t.Fatalf("ok handler calls %d, want 1000", okCalls.Load())
	}
}

func TestSlowQueueDoesNotDelayAnother(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	var slowStarted atomic.Int64
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"slow": {Concurrency: 2}, "fast": {Concurrency: 2}},
		Types: []pgoutbox.EffectType{
			{Name: "stuck", ReplaySafe: true, Handler: func(ctx context.Context, _ *pgoutbox.Delivery) error {
				slowStarted.Add(1)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}},
			{Name: "quick", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }},
		},
	})
	events := watch(t, c)
	var slow []pgoutbox.Effect
	for i := range 10 {
		slow = append(slow, pgoutbox.Effect{Queue: "slow", Type: "stuck", Key: fmt.Sprint(i)})
	}
	b.enqueue(t, slow...)
	b.waitFor(t, "slow queue saturated", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'slow' AND state = 'leased'`) == 2
	})
	var fast []pgoutbox.Effect
	for i := range 200 {
		fast = append(fast, pgoutbox.Effect{Queue: "fast", Type: "quick", Key: fmt.Sprint(i)})
	}
	ids := b.enqueue(t, fast...)
	for _, id := range ids {
		b.waitEvent(t, events, id, "completed")
	}
	// Every fast effect completed while the slow queue was still stuck.
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'slow' AND state <> 'completed'`); n != 10 {
		t.Fatalf("slow queue moved: %d of 10 not completed", n)
	}
	close(release)
}

func TestOnCompleteTransitionCommitsWithCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE results (effect_id bigint PRIMARY KEY, note text)`); err != nil {
		t.Fatal(err)
	}
	var failFirst atomic.Bool
	failFirst.Store(true)
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types: []pgoutbox.EffectType{{Name: "create", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
				if failFirst.Swap(false) {
					return errors.New("transition refused")
				}
				_, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1, 'check_run_id=42')`, d.ID)
				return err
			})
			return nil
		}}},
	})
	events := watch(t, c)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "create", Key: "k"})[0]
	e := b.waitEvent(t, events, id, "available") // the failed transition rolled back and retried
	if e.Outcome != pgoutbox.OutcomeRetry {
		t.Fatalf("outcome %s", e.Outcome)
	}
	b.waitEvent(t, events, id, "completed")
	if n := b.scalar(t, `SELECT count(*) FROM results WHERE effect_id = $1`, id); n != 1 {
		t.Fatalf("%d transition rows, want 1", n)
	}
}

func TestTxHandlerRunsInsideCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE applied (effect_id bigint PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var attempts atomic.Int64
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"jobs": {}},
		Types: []pgoutbox.EffectType{{Name: "plan", TxHandler: func(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
			if _, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, d.ID); err != nil {
				return err
			}
			// The job's own row is already completed inside this transaction.
			var state string
			if err := tx.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, d.ID).Scan(&state); err != nil {
				return err
			}
			if state != "completed" {
				return pgoutbox.Permanent(fmt.Errorf("state inside tx %s", state))
			}
			if attempts.Add(1) == 1 {
				return errors.New("first attempt fails after writing")
			}
			return nil
		}}},
	})
	events := watch(t, c)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "jobs", Type: "plan", Key: "k"})[0]
	b.waitEvent(t, events, id, "available")
	b.waitEvent(t, events, id, "completed")
	if n := b.scalar(t, `SELECT count(*) FROM applied`); n != 1 {
		t.Fatalf("%d applied rows: the failed attempt's write must have rolled back", n)
	}
	if r := b.row(t, id); r.Attempts != 2 {
		t.Fatalf("attempts %d, want 2", r.Attempts)
	}
}

func TestUnknownTypeIsRetriedNotLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types:  []pgoutbox.EffectType{{Name: "known", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}},
	})
	events := watch(t, c)
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "unknown", Key: "k", MaxAttempts: 2})[0]
	e := b.waitEvent(t, events, id, "dead_letter")
	if e.Err == "" || b.row(t, id).Attempts != 2 {
		t.Fatalf("unknown type: %+v", e)
	}
}

// Stop with no grace: a replay-safe effect is available again at once, a
// started non-replay-safe one goes to reconciliation_required. Under
// row-lock leases too (where the non-replay-safe type takes a durable
// lease), and no claim transaction is left open.
func TestGracefulStopReleasesWhatItHolds(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testGracefulStop(t, mode.hold)
		})
	}
}

func testGracefulStop(t *testing.T, hold time.Duration) {
	b := setup(t)
	started := make(chan int64, 2)
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{
			"safe":   {Concurrency: 2, RowLockLease: hold},
			"unsafe": {Concurrency: 2, RowLockLease: hold},
		},
		Types: []pgoutbox.EffectType{
			{Name: "safe", ReplaySafe: true, Handler: blockUntilDone(started)},
			{Name: "unsafe", Handler: blockUntilDone(started)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "safe", Type: "safe", Key: "a"}, pgoutbox.Effect{Queue: "unsafe", Type: "unsafe", Key: "b"})
	<-started
	<-started
	ctx, cancel := context.WithCancel(b.ctx)
	cancel() // no grace: interrupt at once
	if err := c.Stop(ctx); err == nil {
		t.Fatal("Stop with an expired context must report interrupted deliveries")
	}
	if r := b.row(t, ids[0]); r.State != "available" || r.AvailableIn > 0.5 {
		t.Fatalf("replay-safe effect after stop: %+v, want available now", r)
	}
	if r := b.row(t, ids[1]); r.State != "reconciliation_required" || r.Started == nil {
		t.Fatalf("started dispatch after stop: %+v, want reconciliation_required", r)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'`); n != 0 {
		t.Fatalf("%d claim transactions left open after Stop", n)
	}
}

func blockUntilDone(started chan<- int64) pgoutbox.Handler {
	return func(ctx context.Context, d *pgoutbox.Delivery) error {
		started <- d.ID
		<-ctx.Done()
		return ctx.Err()
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := func(context.Context, *pgoutbox.Delivery) error { return nil }
	ph := func(context.Context, []*pgoutbox.Delivery) []error { return nil }
	for name, cfg := range map[string]pgoutbox.Config{
		"timeout over lease":    {LeaseDuration: 5 * time.Second, Queues: map[string]pgoutbox.QueueConfig{"q": {DeliveryTimeout: 5 * time.Second}}},
		"duplicate type":        {Types: []pgoutbox.EffectType{{Name: "a", Handler: h}, {Name: "a", Handler: h}}},
		"no handler":            {Types: []pgoutbox.EffectType{{Name: "a"}}},
		"row lock over timeout": {Queues: map[string]pgoutbox.QueueConfig{"q": {DeliveryTimeout: time.Second, RowLockLease: time.Second}}},
		"negative cooldown":     {Queues: map[string]pgoutbox.QueueConfig{"q": {ClaimCooldown: -time.Millisecond}}},
		"negative lanes":        {Queues: map[string]pgoutbox.QueueConfig{"q": {Storage: pgoutbox.StorageBatch, Lanes: -1}}},
		"too many lanes": {Queues: map[string]pgoutbox.QueueConfig{"q": {Storage: pgoutbox.StorageBatch,
			Lanes: pgoutbox.LanesMax + 1}}},
		"lanes without storage": {Queues: map[string]pgoutbox.QueueConfig{"q": {Lanes: 2}}},
		"both handlers": {Types: []pgoutbox.EffectType{{Name: "a", Handler: h,
			TxHandler: func(context.Context, pgx.Tx, *pgoutbox.Delivery) error { return nil }}}},
		"handler and page handler":     {Types: []pgoutbox.EffectType{{Name: "a", ReplaySafe: true, Handler: h, PageHandler: ph}}},
		"page handler not replay-safe": {Types: []pgoutbox.EffectType{{Name: "a", PageHandler: ph}}},
	} {
		if _, err := pgoutbox.NewClient(b.pool, cfg); err == nil {
			t.Errorf("%s: NewClient accepted an invalid config", name)
		}
	}
}

// TestClaimCooldownClaimsFullBatches: with a ClaimCooldown, a slot freed
// while others are busy does not trigger a claim of a partial batch. The
// handlers are released one at a time, each completion committed before
// the next release (without the cooldown every release would claim one
// effect); every claim must still take a full batch of four, which the
// effects' leased_at (the claim transaction's now()) groups.
func TestClaimCooldownClaimsFullBatches(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const n, batch = 12, 4
			cooldown := time.Hour
			var effects []pgoutbox.Effect
			for i := range n {
				effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "held", Key: fmt.Sprint(i)})
			}
			ids := b.enqueue(t, effects...)
			release := map[int64]chan struct{}{}
			for _, id := range ids {
				release[id] = make(chan struct{})
			}
			started := make(chan int64, n)
			hold := mode.hold
			if hold > 0 {
				// Shorter than the other tests' hold: each batch is promoted
				// to durable leases after it, since its handlers are released
				// one at a time.
				hold = 50 * time.Millisecond
			}
			c := b.startClient(t, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: batch, RowLockLease: hold, ClaimCooldown: cooldown}},
				Types: []pgoutbox.EffectType{{Name: "held", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
					started <- d.ID
					select {
					case <-release[d.ID]:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}}},
			})
			events := watch(t, c)
			for range n {
				var id int64
				select {
				case id = <-started:
				case <-b.ctx.Done():
					t.Fatal("no delivery started")
				}
				close(release[id])
				b.waitEvent(t, events, id, "completed")
			}
			rows, err := b.pool.Query(b.ctx, `SELECT count(*) FROM pgoutbox.effects GROUP BY leased_at ORDER BY min(id)`)
			if err != nil {
				t.Fatal(err)
			}
			sizes, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(sizes) != "[4 4 4]" {
				t.Fatalf("claim batch sizes %v, want [4 4 4]", sizes)
			}
		})
	}
}
