package store

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// BenchmarkConsoleList times one page (50 rows) of the console's effects
// list over a table of retained effects: $PGOUTBOX_BENCH_EFFECTS rows
// (default 1,000,000) over 8 queues, 0.01 % dead letters, the rest
// completed. Each case logs its plan once (EXPLAIN ANALYZE, BUFFERS):
//
//	go test -run '^$' -bench BenchmarkConsoleList -benchtime 20x ./internal/store
func BenchmarkConsoleList(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("PGOUTBOX_BENCH_EFFECTS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10_000 {
			b.Fatalf("PGOUTBOX_BENCH_EFFECTS=%q: want an integer ≥ 10000", s)
		}
		n = v
	}
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, completed_at, last_error)
		 SELECT 'q' || (g % 8), 't' || (g % 3), 'record:' || g, jsonb_build_object('record_id', g::text), 'completed',
		        now(), CASE WHEN g % 100 = 0 THEN 'HTTP 503 from target' END
		 FROM generate_series(1, ` + strconv.Itoa(n) + `) g`,
		`UPDATE pgoutbox.effects SET state = 'dead_letter', completed_at = NULL, last_error = 'HTTP 401: rare failure'
		 WHERE id % 10000 = 0`,
		`VACUUM ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatalf("%.60s: %v", sql, err)
		}
	}
	mid := int64(n / 2)
	for _, c := range []struct {
		name   string
		f      EffectFilter
		before int64
	}{
		{"newest", EffectFilter{}, 0},
		{"deep page", EffectFilter{}, mid},
		{"queue", EffectFilter{Queue: "q3"}, mid},
		{"queue+type+state", EffectFilter{Queue: "q3", Type: "t1", State: "completed"}, 0},
		{"key prefix in queue", EffectFilter{Queue: "q3", KeyPrefix: "record:1"}, 0},
		{"dead letters", EffectFilter{State: "dead_letter"}, 0},
		{"dead letters of a queue", EffectFilter{Queue: "q0", State: "dead_letter"}, 0},
		{"error text, common", EffectFilter{ErrorText: "http 503"}, 0},
		{"error text, rare", EffectFilter{ErrorText: "rare failure"}, 0},
	} {
		b.Run(strings.ReplaceAll(c.name, " ", "_"), func(b *testing.B) {
			sql := effectsListSQL
			if c.f.State == "dead_letter" {
				sql = attentionListSQL
			}
			before := c.before
			if before == 0 {
				before = 1<<63 - 1
			}
			rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql,
				c.f.Queue, c.f.State, c.f.Type, c.f.KeyPrefix, c.f.ErrorText, before, 51, c.f.OrderingKey)
			if err != nil {
				b.Fatal(err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					b.Fatal(err)
				}
				plan = append(plan, line)
			}
			if err := rows.Err(); err != nil {
				b.Fatal(err)
			}
			b.Logf("%d effects, %s:\n%s", n, c.name, strings.Join(plan, "\n"))
			for b.Loop() {
				got, err := ListEffects(ctx, pool, c.f, c.before, 51)
				if err != nil || len(got) == 0 {
					b.Fatalf("%d rows, %v", len(got), err)
				}
			}
		})
	}
}
