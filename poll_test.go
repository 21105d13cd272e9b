package pgoutbox_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A retry is claimed when it falls due, not at the next poll: with the poll
// interval at an hour, no listener, and the retry due well after the active
// tail, only the wake-up the failing worker schedules for the due time can
// claim it again before the test's deadline. The first attempt fails only
// once the claim loop has gone idle (its debug record), so the loop cannot
// have learnt the due time from the database instead.
func TestRetryIsClaimedWhenDueNotAtThePoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := newLogCapture()
	var calls atomic.Int64
	idleAfterClaim := make(chan struct{})
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, _ *pgoutbox.Delivery) error {
			if calls.Add(1) == 1 {
				select {
				case <-idleAfterClaim:
				case <-ctx.Done():
				}
				return pgoutbox.RetryAfter(3*pgoutbox.ActiveTail, errors.New("429"))
			}
			return nil
		}}},
		PollInterval:  time.Hour,
		DisableListen: true,
		Logger:        logs.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	events := watch(t, c)
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	// Idle with the hour-long poll: the active tail after the claim is over.
	logs.waitCount(t, b.ctx, "claim loop idle for the poll interval", 1, func(r slog.Record) bool {
		return r.Message == "claim loop idle" && attr(r, "wake_in").Duration() > time.Minute
	})
	close(idleAfterClaim)
	b.waitEvent(t, events, id, "available") // the retry is scheduled
	b.waitEvent(t, events, id, "completed")
	if r := b.row(t, id); r.Attempts != 2 {
		t.Fatalf("attempts = %d, want 2", r.Attempts)
	}
}

// An effect scheduled for later (here before the client starts, with no
// listener, so no NOTIFY can wake the loop) is claimed when it falls due:
// after an empty claim the loop asks the database for the queue's next due
// time and wakes then.
func TestScheduledEffectIsClaimedWhenDueWithoutPollOrNotify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var dbNow time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT now()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "later", AvailableAt: dbNow.Add(3 * pgoutbox.ActiveTail)})[0]
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues:        map[string]pgoutbox.QueueConfig{"q": {}},
		Types:         []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		PollInterval:  time.Hour,
		DisableListen: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, c) // before Start: the completion cannot be missed
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.waitEvent(t, events, id, "completed")
}

// While PostgreSQL is down a claim loop backs off exponentially (capped) and
// logs the outage once, and once more when claims resume; the listener logs
// its outage once too. Count-based: the test waits for the sixth failed
// claim of the outage and checks what was logged and the waits chosen.
func TestClaimOutageBacksOffAndLogsOnce(t *testing.T) {
	t.Parallel()
	cl := pgtest.NewCluster(t)
	dsn := cl.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b := &bundle{pool: pool, dsn: dsn, ctx: ctx}
	logs := newLogCapture()
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues:        map[string]pgoutbox.QueueConfig{"q": {}},
		Types:         []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		Logger:        logs.Logger(),
		SweepInterval: -1,
		PruneInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, c)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()
	b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })

	if err := cl.Stop(pgtest.StopFast); err != nil {
		t.Fatal(err)
	}
	const retries = 5
	again := logs.waitCount(t, ctx, "failed claims during the outage", retries, msg("claim failed again", "q"))
	want := pgoutbox.ClaimRetryInitial
	for i, r := range again[:retries] {
		want = min(2*want, pgoutbox.ClaimRetryMax)
		if got := attr(r, "retry_in").Duration(); got != want {
			t.Errorf("retry %d waits %s, want %s (doubling from %s, capped at %s)",
				i+2, got, want, pgoutbox.ClaimRetryInitial, pgoutbox.ClaimRetryMax)
		}
	}
	if err := cl.Start(ctx); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "after-outage"})[0]
	b.waitEvent(t, events, id, "completed")
	logs.waitCount(t, ctx, "claims resumed", 1, msg("claims resumed", "q"))

	for m, n := range map[string]int{
		"claim failed; retrying with backoff (logged once until a claim succeeds)": 1,
		"claims resumed": 1,
		"listener disconnected; polling until it reconnects (logged once until it does)": 1,
	} {
		if got := len(logs.matching(msg(m, ""))); got != n {
			t.Errorf("%d records %q during one outage, want %d", got, m, n)
		}
	}
	if r := logs.matching(msg("claims resumed", "q")); attr(r[0], "failed_claims").Int64() < retries+1 {
		t.Errorf("claims resumed after %d failed claims, want at least %d", attr(r[0], "failed_claims").Int64(), retries+1)
	}
}
