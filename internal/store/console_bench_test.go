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
// list over retained effects, in each storage: $PGOUTBOX_BENCH_EFFECTS
// effects (default 1,000,000) over 8 queues. rows: a table of them,
// completed but the newest 5 % (available), 1 % with an error text, 0.01 %
// dead letters. batch: the same effects in the stream of 8 batch queues, in
// 100 batches, settled but the last (available); the dead letters rows of
// pgoutbox.effects, as a batch moves them there. Every tenth effect has
// one of 100 ordering keys. Each case logs its plan once (EXPLAIN ANALYZE,
// BUFFERS):
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
	for _, storage := range []string{StorageRows, StorageBatch} {
		b.Run(storage, func(b *testing.B) { benchConsoleList(b, storage, n) })
	}
}

func benchConsoleList(b *testing.B, storage string, n int) {
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	fill := []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, completed_at, last_error, ordering_key)
		 SELECT 'q' || (g % 8), 't' || (g % 3), 'record:' || g, jsonb_build_object('record_id', g::text),
		        CASE WHEN g > $1 * 0.95 THEN 'available' ELSE 'completed' END::pgoutbox.effect_state,
		        CASE WHEN g <= $1 * 0.95 THEN now() END, CASE WHEN g % 100 = 0 THEN 'HTTP 503 from target' END,
		        CASE WHEN g % 10 = 0 THEN 'k' || (g % 100) END
		 FROM generate_series(1, $1::int) g`,
		`UPDATE pgoutbox.effects SET state = 'dead_letter', completed_at = NULL, last_error = 'HTTP 401: rare failure'
		 WHERE id % 10000 = 0`,
	}
	if storage == StorageBatch {
		fillStream(ctx, b, pool, n, 100, 8)
		fill = []string{
			`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts, dead_lettered_at, last_error)
			 SELECT 'q' || (g % 8), 't' || (g % 3), 'dead:' || g, 'dead_letter', 8, now(), 'HTTP 401: rare failure'
			 FROM generate_series(1, $1::int / 10000) g`,
		}
	}
	for _, sql := range fill {
		var args []any
		if strings.Contains(sql, "$1") {
			args = append(args, n)
		}
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			b.Fatalf("%.60s: %v", sql, err)
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE pgoutbox.effects`); err != nil {
		b.Fatal(err)
	}
	var mid int64
	if err := pool.QueryRow(ctx, `SELECT max(id) / 2 FROM pgoutbox.effect_states`).Scan(&mid); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		f      EffectFilter
		before int64
	}{
		{"newest", EffectFilter{}, 0},
		{"deep page", EffectFilter{}, mid},
		{"queue", EffectFilter{Queue: "q3"}, mid},
		{"queue+type+state", EffectFilter{Queue: "q3", Type: "t1", State: "completed"}, 0},
		{"available", EffectFilter{Queue: "q3", State: "available"}, 0},
		{"key prefix in queue", EffectFilter{Queue: "q3", KeyPrefix: "record:1"}, 0},
		{"ordering key, available", EffectFilter{Queue: "q2", OrderingKey: "k10", State: "available"}, 0},
		{"dead letters", EffectFilter{State: "dead_letter"}, 0},
		{"dead letters of a queue", EffectFilter{Queue: "q0", State: "dead_letter"}, 0},
		{"error text, common", EffectFilter{ErrorText: "http 503"}, 0},
		{"error text, rare", EffectFilter{ErrorText: "rare failure"}, 0},
	} {
		if storage == StorageBatch && c.f.ErrorText == "http 503" {
			continue // a stream effect has no error
		}
		b.Run(strings.ReplaceAll(c.name, " ", "_"), func(b *testing.B) {
			plan := explainAnalyze(ctx, b, pool, c.name, listSQL(c.f), listArgs(c.f, c.before, 51)...)
			b.Logf("%d effects, %s, %s:\n%s", n, storage, c.name, plan)
			for b.Loop() {
				got, err := ListEffects(ctx, pool, c.f, c.before, 51)
				if err != nil || len(got) == 0 {
					b.Fatalf("%d rows, %v", len(got), err)
				}
			}
		})
	}
}
