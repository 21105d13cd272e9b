package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// BenchmarkClaimPauseProbe times a claim of 10 effects from a queue of
// 20,000 with the pause check of migration 00023 (claimSQL) and without it
// (the same statement with the check replaced by true), alternating in one
// loop, and reports both and their ratio. Each claim runs in a
// transaction that is rolled back:
//
//	go test -run '^$' -bench BenchmarkClaimPauseProbe -benchtime 2000x ./internal/store
func BenchmarkClaimPauseProbe(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, available_at)
		 SELECT 'q', 't', g::text, now() - interval '1 minute' FROM generate_series(1, 20000) g`,
		`INSERT INTO pgoutbox.queue_pauses (queue, paused_by) VALUES ('other', 'bench')`,
		`VACUUM ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("%.60s: %v", sql, err)
		}
	}
	alternateClaims(b, pool, "q", notPausedSQL, "µs/claim-with-check")
}

// alternateClaims times a claim of 10 effects of queue with claimSQL and
// with claimSQL's check (a fragment of it) replaced by true, alternating
// in one loop, and reports both (with's name given) and their ratio. Each
// claim runs in a transaction that is rolled back.
func alternateClaims(b *testing.B, pool *pgxpool.Pool, queue, check, with string) {
	without := strings.Replace(claimSQL, check, "true", 1)
	if without == claimSQL {
		b.Fatal("the claim has no such check to leave out")
	}
	ctx := context.Background()
	// The two statements alternate, iteration by iteration, so the load of
	// a shared machine and the table's dead tuples weigh on both alike.
	var spent [2]time.Duration
	claim := func(i int, sql string) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		rows, err := tx.Query(ctx, sql, queue, 10, "w", time.Minute.Seconds(), 1)
		if err != nil {
			b.Fatal(err)
		}
		cs, err := scanClaimed(rows)
		if err != nil || len(cs) != 10 {
			b.Fatalf("claim = %d effects, %v", len(cs), err)
		}
		spent[i] += time.Since(start)
		if err := tx.Rollback(ctx); err != nil {
			b.Fatal(err)
		}
	}
	n := 0
	for b.Loop() {
		claim(n%2, []string{claimSQL, without}[n%2])
		claim((n+1)%2, []string{claimSQL, without}[(n+1)%2])
		n++
	}
	b.ReportMetric(float64(spent[0].Microseconds())/float64(n), with)
	b.ReportMetric(float64(spent[1].Microseconds())/float64(n), "µs/claim-without")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "with/without")
}

// BenchmarkClaimStreamFloor times a claim of 10 ordered effects (20,000 of
// 2,000 keys) of a queue whose storage is rows, with the stream floor of
// migration 00034 (notBehindStreamSQL) and without it, as
// BenchmarkClaimPauseProbe does:
//
//	go test -run '^$' -bench BenchmarkClaimStreamFloor -benchtime 2000x ./internal/store
func BenchmarkClaimStreamFloor(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, available_at, ordering_key)
		 SELECT 'o', 't', g::text, now() - interval '1 minute', (g % 2000)::text FROM generate_series(1, 20000) g`,
		`INSERT INTO pgoutbox.queue_storage (queue, storage) VALUES ('o', 'rows')`,
		`VACUUM ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("%.60s: %v", sql, err)
		}
	}
	alternateClaims(b, pool, "o", notBehindStreamSQL, "µs/claim-with-floor")
}
