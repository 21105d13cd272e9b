package reliability

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Scenario 12: two sweepers at once, on separate connections, over the
// same expired leases: each lease is recovered exactly once (the history
// trigger sees one leased → available transition per effect, and the
// sweepers' results are disjoint and cover every effect).
func TestTwoSweepersRecoverEachLeaseOnce(t *testing.T) {
	long(t)
	ctx := timeout(t, 2*time.Minute)
	d := newDB(t)
	d.exec(t, ctx, historySQL)
	const n, rounds = 3000, 3
	stats := figures{"effects_per_round": n, "rounds": rounds}
	for round := range rounds {
		// Row storage whatever the test matrix says: the sweepers recover
		// expired lease rows, which ClaimLeases (the SQL API's row claim)
		// takes here.
		want := d.enqueue(t, ctx, spec{queue: "q", n: n, dispatchEvery: 5, keyPrefix: string(rune('a' + round)),
			storage: pgoutbox.StorageRows})
		leases, err := pgoutbox.ClaimLeases(ctx, d.pool, "q", "dead-worker", n, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) != n {
			t.Fatalf("claimed %d, want %d", len(leases), n)
		}
		// Half of the dispatches had started: those go to reconciliation.
		for i, l := range leases {
			if l.Type == typeDispatch && i%2 == 0 {
				if err := l.MarkStarted(ctx, d.pool); err != nil {
					t.Fatal(err)
				}
			}
		}
		d.exec(t, ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second' WHERE state = 'leased'`)
		d.exec(t, ctx, `TRUNCATE public.effect_history`)

		var pools [2]*pgxpool.Pool
		for i := range pools {
			p, err := pgxpool.New(ctx, d.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			pools[i] = p
		}
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results [2][]store.Rescued
			errs    [2]error
		)
		for i := range pools {
			wg.Go(func() {
				<-start
				for {
					// Small batches, so the two sweepers interleave.
					r, err := store.Sweep(ctx, pools[i], 37, 0)
					if err != nil {
						errs[i] = err
						return
					}
					results[i] = append(results[i], r...)
					if len(r) == 0 {
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		seen := map[int64]int{}
		for _, rs := range results {
			for _, r := range rs {
				seen[r.ID]++
			}
		}
		twice := 0
		for _, k := range seen {
			if k > 1 {
				twice++
			}
		}
		if len(seen) != n || twice != 0 {
			t.Errorf("round %d: the sweepers recovered %d distinct leases (%d twice), want %d once each", round, len(seen), twice, n)
		}
		for id := range want {
			if seen[id] != 1 {
				t.Errorf("round %d: effect %d recovered %d times", round, id, seen[id])
				break
			}
		}
		transitions := d.scalar(t, ctx, `SELECT count(*) FROM public.effect_history WHERE old_state = 'leased' AND new_state <> 'leased'`)
		perRow := d.scalar(t, ctx, `SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM public.effect_history
			WHERE old_state = 'leased' AND new_state <> 'leased' GROUP BY id) x`)
		if transitions != n || perRow != 1 {
			t.Errorf("round %d: %d recoveries written, at most %d for one effect; want %d and 1", round, transitions, perRow, n)
		}
		recon := d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'reconciliation_required'`)
		stats["sweeper_a_round_"+string(rune('1'+round))] = len(results[0])
		stats["sweeper_b_round_"+string(rune('1'+round))] = len(results[1])
		stats["reconciliation_after_round_"+string(rune('1'+round))] = recon
		// Clear the round: complete what went back to available.
		d.exec(t, ctx, `UPDATE pgoutbox.effects SET state = 'completed', completed_at = now() WHERE state = 'available'`)
	}
	report(t, "12 two sweepers at once", stats)
}
