package store

import (
	"context"
	"strings"
	"testing"
	"time"

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
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_custom_plan`); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]struct {
		sql, args, index string
	}{
		"all, first page":               {effectsListSQL, `('', '', '', '', '', 9223372036854775807, 51, '')`, "effects_pkey"},
		"queue, next page":              {effectsListSQL, `('q1', '', '', '', '', 15000, 51, '')`, "effects_pkey"},
		"state and type":                {effectsListSQL, `('', 'completed', 't', '', '', 9223372036854775807, 51, '')`, "effects_pkey"},
		"dead letters":                  {attentionListSQL, `('', 'dead_letter', '', '', '', 9223372036854775807, 51, '')`, "effects_attention_idx"},
		"dead letters of q0":            {attentionListSQL, `('q0', 'dead_letter', '', '', '', 9223372036854775807, 51, '')`, "effects_attention_idx"},
		"ordering key, available in q3": {orderedListSQL, `('q3', 'available', '', '', '', 9223372036854775807, 51, 'k7')`, "effects_ordering_idx"},
		"ordering key, dead letters":    {orderedListSQL, `('', 'dead_letter', '', '', '', 9223372036854775807, 51, 'k7')`, "effects_ordering_idx"},
	} {
		stmt := "console_" + strings.ReplaceAll(strings.ReplaceAll(name, " ", "_"), ",", "")
		if _, err := conn.Exec(ctx, `PREPARE `+stmt+` AS `+st.sql); err != nil {
			t.Fatalf("%s: prepare: %v", name, err)
		}
		rows, err := conn.Query(ctx, `EXPLAIN EXECUTE `+stmt+st.args)
		if err != nil {
			t.Fatalf("%s: explain: %v", name, err)
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
			t.Fatal(err)
		}
		p := plan.String()
		if strings.Contains(p, "Seq Scan") || !strings.Contains(p, st.index) {
			t.Errorf("%s: want a walk of %s, no sequential scan; plan:\n%s", name, st.index, p)
		}
		if st.index == "effects_pkey" && strings.Contains(p, "Sort") {
			t.Errorf("%s: the page sorts instead of walking the primary key in order; plan:\n%s", name, p)
		}
	}
}
