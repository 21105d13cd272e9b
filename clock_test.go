package pgoutbox_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// shiftedClockSQL gives the test's database a clock a day ahead of the
// process's, for sessions whose search_path puts public before pg_catalog:
// their unqualified now() (every engine statement's clock) resolves to
// public.now(). A schedule computed on the process's clock is then a day
// off, and only one computed on the database's clock is right.
const shiftedClockSQL = `
CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT pg_catalog.now() + interval '1 day' $$;`

// shiftedPool returns a pool on the test's database whose sessions see the
// shifted clock.
func (b *bundle) shiftedPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, shiftedClockSQL); err != nil {
		t.Fatal(err)
	}
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["search_path"] = "public, pg_catalog"
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var ahead time.Duration
	if err := pool.QueryRow(b.ctx, `SELECT now() - pg_catalog.now()`).Scan(&ahead); err != nil || ahead != 24*time.Hour {
		t.Fatalf("the shifted clock is %s ahead (%v), want 24h", ahead, err)
	}
	return pool
}

// Defect 7 (issue #11): Effect.Delay is measured on the database clock.
// The database's clock is a day ahead of the process's here, so a delay
// turned into an instant on the process's clock would make the effect due
// at once.
func TestEffectDelayUsesTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	shifted := b.shiftedPool(t)
	var id int64
	err := pgx.BeginFunc(b.ctx, shifted, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "later", Delay: time.Hour})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var due time.Duration
	if err := shifted.QueryRow(b.ctx, `SELECT available_at - now() FROM pgoutbox.effects WHERE id = $1`, id).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if due < 59*time.Minute || due > time.Hour {
		t.Fatalf("an effect delayed by 1h is due in %s on the database clock, want about 1h", due)
	}
	claimed, err := pgoutbox.ClaimLeases(b.ctx, shifted, "q", "w", 1, time.Minute)
	if err != nil || len(claimed) != 0 {
		t.Fatalf("a delayed effect was claimed at once (%d, %v)", len(claimed), err)
	}

	// Bad delays are refused and write nothing.
	for _, e := range []pgoutbox.Effect{
		{Queue: "q", Type: "t", Key: "neg", Delay: -time.Second},
		{Queue: "q", Type: "t", Key: "both", Delay: time.Second, AvailableAt: time.Now().Add(time.Hour)},
	} {
		_, err := enqueueOne(b, e)
		var inv *pgoutbox.InvalidEffectError
		if !errors.As(err, &inv) || inv.Field != "Delay" {
			t.Fatalf("enqueue %+v: %v, want an InvalidEffectError on Delay", e, err)
		}
	}
	if n := b.count(t); n != 1 {
		t.Fatalf("%d effects after refused enqueues, want 1", n)
	}
}

// Defect 7 (issue #11): a Retry-After is honoured up to RetryAfterCap (or
// the backoff cap when larger), never for years.
func TestRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		backoffCap time.Duration
		want       time.Duration
	}{
		{300 * time.Second, pgoutbox.RetryAfterCap},
		{2 * time.Hour, 2 * time.Hour},
	} {
		t.Run(fmt.Sprint(tc.backoffCap), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})
			leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "w", 1, time.Minute)
			if err != nil || len(leases) != 1 {
				t.Fatalf("claim: %d, %v", len(leases), err)
			}
			const tenYears = 10 * 365 * 24 * time.Hour
			state, err := leases[0].Fail(b.ctx, b.pool, pgoutbox.RetryAfter(tenYears, errors.New("429")), true, tc.backoffCap)
			if err != nil || state != pgoutbox.StateAvailable {
				t.Fatalf("fail: %s, %v", state, err)
			}
			var due time.Duration
			if err := b.pool.QueryRow(b.ctx, `SELECT available_at - now() FROM pgoutbox.effects WHERE id = $1`, leases[0].ID).Scan(&due); err != nil {
				t.Fatal(err)
			}
			if due > tc.want || due < tc.want-time.Minute {
				t.Fatalf("Retry-After of ten years with backoff cap %s: due in %s, want %s", tc.backoffCap, due, tc.want)
			}
		})
	}
}
