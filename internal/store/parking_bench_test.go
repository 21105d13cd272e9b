package store

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// BenchmarkClaimBehindBlockedKeys times the claim of one unordered effect
// enqueued after K ordering keys stuck behind a strict dead letter, each
// with 10 waiting followers (under the 32 of ParkBehindDefault), for K = 0,
// 100, 1,000 and 10,000: first as the sweeper left them before issue 28
// (nothing parked: the claim walks every follower first, one head-of-line
// probe each), then after Park (the followers of a stuck head are parked
// whatever their number). Each claim runs in a transaction that is rolled
// back, so every iteration claims the same effect; each case logs how many
// blocked rows the claim walked (EXPLAIN ANALYZE):
//
//	go test -run '^$' -bench BenchmarkClaimBehindBlockedKeys -benchtime 20x ./internal/store
func BenchmarkClaimBehindBlockedKeys(b *testing.B) {
	const followers = 10
	for _, keys := range []int{0, 100, 1000, 10000} {
		pool, _ := pgtest.NewPool(b)
		ctx := context.Background()
		k := strconv.Itoa(keys)
		for _, sql := range []string{
			`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key, state, attempts, dead_lettered_at)
			 SELECT 'q', 't', 'head-' || g, 'k' || g, 'dead_letter', 8, now() FROM generate_series(1, ` + k + `) g`,
			`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key, available_at)
			 SELECT 'q', 't', 'f-' || g || '-' || i, 'k' || g, now() - interval '1 minute'
			 FROM generate_series(1, ` + k + `) g, generate_series(1, ` + strconv.Itoa(followers) + `) i ORDER BY g, i`,
			`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('q', 't', 'free')`,
			`VACUUM ANALYZE pgoutbox.effects`,
		} {
			if _, err := pool.Exec(ctx, sql); err != nil {
				b.Fatalf("%.60s: %v", sql, err)
			}
		}
		claim := func(b *testing.B) {
			walked, _ := claimWalked(ctx, b, pool, "q")
			b.Logf("%d blocked keys: the claim walked %d blocked rows", keys, walked)
			b.ResetTimer()
			for b.Loop() {
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				c, err := Claim(ctx, tx, "q", "w", 1, time.Minute)
				if err != nil || len(c) != 1 {
					b.Fatalf("claim = %d effects, %v", len(c), err)
				}
				if err := tx.Rollback(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(fmt.Sprintf("keys=%d/unparked", keys), claim)
		for {
			n, err := Park(ctx, pool, "", ParkBehindDefault, 10000)
			if err != nil {
				b.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE pgoutbox.effects`); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("keys=%d/parked", keys), claim)
	}
}
