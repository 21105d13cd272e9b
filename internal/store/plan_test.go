package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m, func() error { return goleak.Find() }) }

// Every statement that finds effects by id probes the primary key, whatever
// the statistics say. The trap: autovacuum analyzes the table while almost
// nothing is leased, then thousands of rows are leased; a by-id statement
// that also says state = 'leased' then looks cheaper through the partial
// lease index, which the planner walks once per effect (1 s for a 1,000-effect
// completion instead of 7 ms).
func TestByIDStatementsProbeThePrimaryKey(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		 SELECT 'q', 't', g::text FROM generate_series(1, 20000) g`,
		`ANALYZE pgoutbox.effects`, // statistics: nothing leased
		`ANALYZE pgoutbox.effect_keys`,
		`UPDATE pgoutbox.effects SET state = 'leased', lease_token = gen_random_uuid(),
		 lease_expires_at = now() + interval '1 minute' WHERE id <= 4000`,
		`UPDATE pgoutbox.effects SET state = 'dead_letter' WHERE id > 19000`,
		`UPDATE pgoutbox.effects SET state = 'reconciliation_required' WHERE id BETWEEN 18000 AND 19000`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	ids := make([]int64, 1000)
	toks := make([]uuid.UUID, 1000)
	types := make([]string, 1000)
	for i := range ids {
		ids[i], toks[i], types[i] = int64(i+1), uuid.New(), "t"
	}
	tok := toks[0]
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"claim":           {claimSQL, []any{"q", 1000, "w", 60.0, 1}},
		"complete":        {completeSQL, []any{ids, toks, types}},
		"extend":          {extendSQL, []any{ids, toks, types, 60.0}},
		"fail":            {failSQL, []any{int64(1), tok, "t", "retry", 1.0, "x"}},
		"mark started":    {startSQL, []any{int64(1), tok, "t"}},
		"promote":         {promoteSQL, []any{ids, len(ids), "w", 60.0, 1}},
		"complete locked": {completeLockedSQL, []any{ids, "w"}},
		"resolve":         {resolveSQL, []any{int64(18500), "t", []byte(`{}`)}},
	} {
		p := explain(ctx, t, pool, name, st.sql, st.args...)
		banned := []string{"effects_lease_expiry_idx", "effects_claim_idx", "effects_attention_idx", "Seq Scan on effects"}
		if name == "claim" {
			banned = banned[2:] // it finds its rows through the claim index, then updates them by id
		}
		for _, idx := range banned {
			if strings.Contains(p, idx) {
				t.Errorf("%s uses %s:\n%s", name, idx, p)
			}
		}
		if !strings.Contains(p, "effects_pkey") {
			t.Errorf("%s does not probe the primary key:\n%s", name, p)
		}
	}

	// Looking up existing keys (an enqueue that repeats keys) probes the key
	// table's primary key, never a scan of the whole key table.
	queues, keys := make([]string, 1000), make([]string, 1000)
	for i := range keys {
		queues[i], keys[i] = "q", fmt.Sprint(i*7+1)
	}
	p := explain(ctx, t, pool, "lookup", lookupSQL, queues, keys)
	if strings.Contains(p, "Seq Scan on effect_keys") || !strings.Contains(p, "effect_keys_pkey") {
		t.Errorf("lookup does not probe effect_keys_pkey:\n%s", p)
	}
}

// explain returns the plan of sql with args.
func explain(ctx context.Context, t *testing.T, pool *pgxpool.Pool, name, sql string, args ...any) string {
	t.Helper()
	rows, err := pool.Query(ctx, "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return plan.String()
}

// The /workers and `status` aggregates follow the live backlog and the
// window's completions, not the retained history: with 20,000 completed
// effects retained from hours ago, Stats, Throughput and Attention read them
// through their partial indexes and never scan the table (the projection's
// former copy of the stats query, without Stats' WHERE, was a sequential
// scan of every retained row on each /workers refresh).
func TestReportsUseThePartialIndexes(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, completed_at, created_at)
		 SELECT 'q', 't', g::text, 'completed', now() - interval '3 hours', now() - interval '3 hours'
		 FROM generate_series(1, 20000) g`,
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		 SELECT 'q', 't', 'live' || g FROM generate_series(1, 20) g`,
		`UPDATE pgoutbox.effects SET state = 'dead_letter', dead_lettered_at = now() WHERE idempotency_key = 'live1'`,
		`ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for name, st := range map[string]struct {
		sql  string
		args []any
		uses []string
	}{
		"stats": {statsSQL, []any{"", "", 0.0, 60.0},
			[]string{"effects_claim_idx", "effects_lease_expiry_idx", "effects_attention_idx", "effects_completed_idx"}},
		"throughput": {throughputSQL, []any{60.0}, []string{"effects_completed_idx"}},
		"attention":  {attentionSQL, []any{50}, []string{"effects_attention_idx"}},
	} {
		p := explain(ctx, t, pool, name, st.sql, st.args...)
		if strings.Contains(p, "Seq Scan on effects") {
			t.Errorf("%s scans the whole table:\n%s", name, p)
		}
		for _, idx := range st.uses {
			if !strings.Contains(p, idx) {
				t.Errorf("%s does not use %s:\n%s", name, idx, p)
			}
		}
	}
	// And the numbers: the retained history is not counted.
	stats, err := Stats(ctx, pool, OpsFilter{}, 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, s := range stats {
		if s.QueueTotal {
			got[s.State] = s.Count
		}
	}
	if got["available"] != 19 || got["dead_letter"] != 1 || got["completed"] != 0 {
		t.Fatalf("stats by state: %v", got)
	}
}

// A statement that deletes a batch picked by a locking subquery (LIMIT …
// FOR UPDATE SKIP LOCKED) runs that subquery once, as an InitPlan. Written
// as "id IN (SELECT …)", the planner may join the subquery and rescan it:
// the engine's prune was seen to run for over five minutes on 20,000
// completed effects that way (issue 32's benchmark), each rescan locking
// and skipping rows anew.
func TestBatchSubqueriesRunOnce(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, completed_at)
		 SELECT 'q', 't', g::text, 'completed', now() - interval '3 hours' FROM generate_series(1, 20000) g`,
		`ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for name, st := range map[string]struct {
		sql  string
		args []any
	}{
		"prune":               {pruneSQL, []any{60.0, 1000}},
		"prune keys":          {pruneKeysSQL, []any{60.0, 1000}},
		"prune notify":        {pruneNotifyPendingSQL, []any{1000}},
		"purge queue effects": {purgeQueueSQL[0], []any{"q", 1000}},
		"purge queue keys":    {purgeQueueSQL[1], []any{"q", 1000}},
	} {
		if p := explain(ctx, t, pool, name, st.sql, st.args...); !strings.Contains(p, "InitPlan") {
			t.Errorf("%s does not pick its batch in an InitPlan:\n%s", name, p)
		}
	}
}
