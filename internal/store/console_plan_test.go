package store

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The console's effects list pages by id through an index, whatever the
// filters: the general list walks the primary key backwards and stops
// after a page (no sort of the table), and the dead-letter and
// reconciliation lists read effects_attention_idx only, and an ordering
// key with a state other than completed reads effects_ordering_idx only. (A filter that
// matches almost nothing, such as a rare error text, has no index of its
// own: its page reads until it finds a page's worth, or the table.)
// Checked on custom plans, which PostgreSQL uses for these statements (see
// attentionListSQL).
func TestConsoleListsUseAnIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, completed_at)
		 SELECT 'q' || (g % 4), 't', g::text, 'completed', now() FROM generate_series(1, 20000) g`,
		`UPDATE pgoutbox.effects SET state = 'dead_letter', completed_at = NULL, last_error = 'boom' WHERE id % 500 = 0`,
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, ordering_key)
		 SELECT 'q' || (g % 4), 't', 'o' || g, 'available', 'k' || (g % 50) FROM generate_series(1, 2000) g`,
		`ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for name, st := range map[string]struct {
		f      EffectFilter
		before int64
		index  string
	}{
		"all, first page":               {EffectFilter{}, 0, "Index Scan Backward using effects_pkey"},
		"queue, next page":              {EffectFilter{Queue: "q1"}, 15000, "Index Scan Backward using effects_pkey"},
		"state and type":                {EffectFilter{State: "completed", Type: "t"}, 0, "Index Scan Backward using effects_pkey"},
		"dead letters":                  {EffectFilter{State: "dead_letter"}, 0, "effects_attention_idx"},
		"dead letters of q0":            {EffectFilter{Queue: "q0", State: "dead_letter"}, 0, "effects_attention_idx"},
		"ordering key, available in q3": {EffectFilter{Queue: "q3", State: "available", OrderingKey: "k7"}, 0, "effects_ordering_idx"},
		"ordering key, dead letters":    {EffectFilter{State: "dead_letter", OrderingKey: "k7"}, 0, "effects_ordering_idx"},
	} {
		p := explain(ctx, t, pool, name, listSQL(st.f), listArgs(st.f, st.before, 51)...)
		if strings.Contains(p, "Seq Scan on effects") || !strings.Contains(p, st.index) {
			t.Errorf("%s: want %s, no sequential scan; plan:\n%s", name, st.index, p)
		}
	}
}

// listArgs are ListEffects' parameters of its statements.
func listArgs(f EffectFilter, before int64, limit int) []any {
	if before <= 0 {
		before = 1<<63 - 1
	}
	return []any{f.Queue, f.State, f.Type, f.KeyPrefix, f.ErrorText, before, limit, f.OrderingKey}
}

// fillStream makes queues q0..q{queues-1} batch queues and enqueues n
// effects into them through pgoutbox.effects (the trigger sends them to
// the stream), in chunks of one transaction each, ticked after each: all
// chunks but the last are settled batches, the last is a batch not leased
// yet (its effects available). Every tenth effect has one of 100 ordering
// keys; the payload names a record. Ends with ANALYZE.
func fillStream(ctx context.Context, tb testing.TB, db DBTX, n, chunks, queues int) {
	tb.Helper()
	var names, storages []string
	for q := range queues {
		names, storages = append(names, fmt.Sprintf("q%d", q)), append(storages, StorageBatch)
	}
	if err := SetStorage(ctx, db, names, storages, nil); err != nil {
		tb.Fatal(err)
	}
	size := n / chunks
	for c := range chunks {
		if _, err := db.Exec(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, ordering_key)
			SELECT 'q' || (g % $3), 't' || (g % 3), 'record:' || g, jsonb_build_object('record_id', g::text),
			       CASE WHEN g % 10 = 0 THEN 'k' || (g % 100) END
			FROM generate_series($1::int, $2::int) g`, c*size+1, (c+1)*size, queues); err != nil {
			tb.Fatalf("chunk %d: %v", c, err)
		}
		for _, q := range names {
			if _, err := Tick(ctx, db, q); err != nil {
				tb.Fatal(err)
			}
		}
		if c < chunks-1 {
			if _, err := db.Exec(ctx, `UPDATE pgoutbox.stream_batches SET done_through = max_id, done_at = now()
				WHERE done_at IS NULL`); err != nil {
				tb.Fatal(err)
			}
		}
	}
	for _, sql := range []string{`ANALYZE pgoutbox.stream`, `ANALYZE pgoutbox.stream_batches`, `ANALYZE pgoutbox.effects`} {
		if _, err := db.Exec(ctx, sql); err != nil {
			tb.Fatal(err)
		}
	}
}

// A batch queue's effects in the stream do not make the console's lists a
// scan of the stream: the general list walks stream_id_idx backwards and
// stops after a page, as it walks the effects' primary key; a queue with
// no row in the stream, an error text or an exception's state skip the
// stream; an ordering key with a state other than completed reads the
// effects still to deliver (stream_xid_idx), not the settled ones. Checked
// with 20,000 stream effects in 20 settled batches and 1,000 to deliver.
func TestConsoleListsWalkTheStreamByIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	fillStream(ctx, t, pool, 21000, 21, 4)
	if _, err := pool.Exec(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, completed_at)
		SELECT 'rq', 't', 'r' || g, 'completed', now() FROM generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	if n := pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pgoutbox.effect_states WHERE storage = 'batch' AND state = 'completed'`); n != 20000 {
		t.Fatalf("%d stream effects completed, want 20000", n)
	}
	for name, st := range map[string]struct {
		f      EffectFilter
		before int64
		// want is in the plan; untouched: no row of the stream is read.
		want      string
		untouched bool
	}{
		"all, first page":   {EffectFilter{}, 0, "Scan Backward using stream_0_id_idx", false},
		"queue, deep page":  {EffectFilter{Queue: "q1"}, 9000, "Scan Backward using stream_0_id_idx", false},
		"type":              {EffectFilter{Type: "t1"}, 0, "Scan Backward using stream_0_id_idx", false},
		"completed of type": {EffectFilter{State: "completed", Type: "t1"}, 0, "Scan Backward using stream_0_id_idx", false},
		"available":         {EffectFilter{State: "available"}, 0, "stream_0_queue_xid_idx", false},
		"a rows queue":      {EffectFilter{Queue: "rq"}, 0, "", true},
		"error text":        {EffectFilter{ErrorText: "boom"}, 0, "", true},
		"ordering key":      {EffectFilter{Queue: "q2", State: "available", OrderingKey: "k42"}, 0, "stream_0_queue_xid_idx", false},
		"ordering key, all": {EffectFilter{State: "leased", OrderingKey: "k42"}, 0, "stream_0_queue_xid_idx", false},
	} {
		p := explainAnalyze(ctx, t, pool, name, listSQL(st.f), listArgs(st.f, st.before, 51)...)
		if m := regexp.MustCompile(`Execution Time: \S+ ms`).FindString(p); m != "" {
			t.Logf("%s: %s", name, m)
			if os.Getenv("PLAN") == name {
				t.Log(p)
			}
		}
		if strings.Contains(p, "JIT:") {
			t.Errorf("%s: compiled with JIT; plan:\n%s", name, p)
		}
		if strings.Contains(p, "Seq Scan on stream_0 ") || !strings.Contains(p, st.want) {
			t.Errorf("%s: want %s, no sequential scan; plan:\n%s", name, st.want, p)
		}
		// No node reads more than a few pages' worth of the stream.
		most := 2000
		if st.untouched {
			most = 0
		}
		for _, m := range regexp.MustCompile(`on stream_0 .*actual time=\S+ rows=(\d+) loops=(\d+)`).FindAllStringSubmatch(p, -1) {
			rows, _ := strconv.Atoi(m[1])
			loops, _ := strconv.Atoi(m[2])
			if rows*loops > most {
				t.Errorf("%s: a scan of the stream read %d rows, want at most %d; plan:\n%s", name, rows*loops, most, p)
			}
		}
	}
}

// explainAnalyze runs sql under EXPLAIN ANALYZE with args bound (a custom
// plan), as ListEffects runs it (jit off when noJIT),
// and returns the plan.
func explainAnalyze(ctx context.Context, t testing.TB, pool *pgxpool.Pool, name, sql string, args ...any) string {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if noJIT(sql) {
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return strings.Join(lines, "\n") + "\n"
}
