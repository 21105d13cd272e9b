package reliability

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// historySQL records every insert (old_state "none") and update of an
// effect row with the database clock of the statement that made it (test
// fixture, in the test's own database). A batch-storage effect has a row
// only once it leaves its batch (a retry, a dead letter, a promoted or
// unrun effect): its history starts with that insert.
const historySQL = `
CREATE TABLE public.effect_history (
    seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           bigint NOT NULL,
    old_state    text NOT NULL,
    new_state    text NOT NULL,
    attempts     integer NOT NULL,
    available_at timestamptz NOT NULL,
    leased_at    timestamptz,
    lease_owner  text,
    at           timestamptz NOT NULL
);
CREATE FUNCTION public.record_effect_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.effect_history (id, old_state, new_state, attempts, available_at, leased_at, lease_owner, at)
    VALUES (NEW.id, CASE WHEN TG_OP = 'INSERT' THEN 'none' ELSE OLD.state::text END, NEW.state::text, NEW.attempts,
        NEW.available_at, NEW.leased_at, NEW.lease_owner, now());
    RETURN NULL;
END $$;
CREATE TRIGGER effects_history AFTER INSERT OR UPDATE ON pgoutbox.effects
    FOR EACH ROW EXECUTE FUNCTION public.record_effect_history();`

// shiftClockSQL moves the database clock of the test's database a day
// ahead of the process's clock, for sessions whose search_path puts public
// before pg_catalog: there the engine's unqualified now() and
// statement_timestamp() resolve to these functions. A schedule computed on
// the process's clock (time.Now() + delay) is then a day in the database's
// past, claimed at once; only the database's clock explains a retry that
// waits for its Retry-After.
const shiftClockSQL = `
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT pg_catalog.now() + interval '1 day' $$;
CREATE FUNCTION public.statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT pg_catalog.statement_timestamp() + interval '1 day' $$;`

// shiftedPool returns a pool of d whose sessions see the shifted clock.
func shiftedPool(t *testing.T, ctx context.Context, d *db) *pgxpool.Pool {
	t.Helper()
	d.exec(t, ctx, shiftClockSQL)
	cfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "public, pg_catalog"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var ahead time.Duration
	if err := pool.QueryRow(ctx, `SELECT now() - pg_catalog.now()`).Scan(&ahead); err != nil || ahead != 24*time.Hour {
		t.Fatalf("the shifted database clock is %s ahead of the real one (%v), want 24h", ahead, err)
	}
	return pool
}

// Scenario 4: the target answers 503, then 429 with Retry-After: 7, then
// 200. The retry after the 429 is not claimed before the database's now()
// at the failure + 7 s; scheduled and observed delays are reported. The
// database clock runs a day ahead of the process's (shiftClockSQL), so a
// schedule taken from the process's clock fails every check below.
func TestRetryAfterUsesDatabaseClock(t *testing.T) {
	long(t)
	ctx := timeout(t, 2*time.Minute)
	d := newDB(t)
	d.exec(t, ctx, historySQL)
	d.pool = shiftedPool(t, ctx, d)
	const retryAfter = 7
	var n atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			http.Error(w, "upstream unavailable", http.StatusServiceUnavailable)
		case 2:
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	defer target.Close()
	hc := target.Client()
	handler := func(ctx context.Context, dl *pgoutbox.Delivery) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.URL, nil)
		if err != nil {
			return pgoutbox.Permanent(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return pgoutbox.Retry(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil {
				return pgoutbox.Retry(fmt.Errorf("429 without a usable Retry-After"))
			}
			return pgoutbox.RetryAfter(time.Duration(secs)*time.Second, fmt.Errorf("429"))
		case resp.StatusCode >= 500:
			return pgoutbox.Retry(fmt.Errorf("status %d", resp.StatusCode))
		case resp.StatusCode != http.StatusOK:
			return pgoutbox.Permanent(fmt.Errorf("status %d", resp.StatusCode))
		}
		return nil
	}
	var id int64
	d.useTestStorage(t, ctx, "q")
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "q", Type: typeSafe, Key: "rate-limited"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	client, err := pgoutbox.NewClient(d.pool, pgoutbox.Config{
		Queues:        withTestStorage(map[string]pgoutbox.QueueConfig{"q": {Concurrency: 1, DeliveryTimeout: 5 * time.Second}}),
		Types:         []pgoutbox.EffectType{{Name: typeSafe, ReplaySafe: true, Handler: handler}},
		LeaseDuration: 10 * time.Second,
		PollInterval:  50 * time.Millisecond, // the claim follows available_at closely
		PruneInterval: -1,
		// BackoffCap: the default (300 s); the first retry is 2^1 s ± 10 %.
	})
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(64)
	defer unsubscribe()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(sctx); err != nil {
			t.Error(err)
		}
	}()
	for done := false; !done; {
		select {
		case e := <-events:
			done = e.EffectID == id && e.State == pgoutbox.StateCompleted
		case <-ctx.Done():
			t.Fatal("the effect never completed")
		}
	}

	d.checkStorage(t, ctx)
	// The failures (leased → available) and the claims (available →
	// leased), in order, all on the database clock.
	type step struct {
		newState   string
		attempts   int
		available  time.Time
		leasedAt   *time.Time
		statements time.Time
	}
	rows, err := d.pool.Query(ctx, `SELECT new_state, attempts, available_at, leased_at, at FROM public.effect_history WHERE id = $1 AND old_state <> new_state ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	var steps []step
	for rows.Next() {
		var s step
		if err := rows.Scan(&s.newState, &s.attempts, &s.available, &s.leasedAt, &s.statements); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The row storage's enqueue (an insert, attempts 0) is not a step. In
	// batch storage the first attempt is claimed with its batch, not as a
	// row: the history starts with the retry its failure inserted.
	if len(steps) > 0 && steps[0].newState == "available" && steps[0].attempts == 0 {
		steps = steps[1:]
	}
	if len(steps) > 0 && steps[0].newState == "available" && testStorage() == pgoutbox.StorageBatch {
		steps = append([]step{{newState: "leased (from its batch)", attempts: 1}}, steps...)
	}
	// Expect: leased(1), available, leased(2), available, leased(3), completed.
	if len(steps) != 6 || steps[1].newState != "available" || steps[3].newState != "available" || steps[4].newState != "leased" || steps[5].newState != "completed" {
		t.Fatalf("history %+v, want claim, retry, claim, retry, claim, complete", steps)
	}
	sched1 := steps[1].available.Sub(steps[1].statements)
	obs1 := steps[2].statements.Sub(steps[1].statements)
	sched2 := steps[3].available.Sub(steps[3].statements)
	obs2 := steps[4].statements.Sub(steps[3].statements)
	if sched1 < 1800*time.Millisecond || sched1 > 2200*time.Millisecond {
		t.Errorf("after the 503 (attempt 1) the retry was scheduled %s later, want 2 s ± 10 %%", sched1)
	}
	if sched2 < retryAfter*time.Second {
		t.Errorf("after the 429 the retry was scheduled %s later, want at least Retry-After %d s", sched2, retryAfter)
	}
	if obs2 < retryAfter*time.Second {
		t.Errorf("after the 429 the next attempt was claimed %s later (database clock), before now()+%d s", obs2, retryAfter)
	}
	if obs1 < sched1 {
		t.Errorf("after the 503 the next attempt was claimed %s later, before its scheduled %s", obs1, sched1)
	}
	if got := n.Load(); got != 3 {
		t.Errorf("the target saw %d calls, want 3", got)
	}
	report(t, "4 5xx then 429 Retry-After 7", figures{
		"after_503_scheduled_s": round(sched1.Seconds()), "after_503_observed_s": round(obs1.Seconds()),
		"after_429_scheduled_s": round(sched2.Seconds()), "after_429_observed_s": round(obs2.Seconds()),
		"retry_after_s": retryAfter, "poll_interval_s": 0.05, "target_calls": n.Load(),
	})
}
