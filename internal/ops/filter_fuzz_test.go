package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// FuzzFilterIsLiteral checks the operator filters (--queue, --effect-type)
// on arbitrary strings against a real database: every command narrows only
// to rows whose queue and effect type equal the filter byte for byte (no
// pattern, no injection), dry runs change nothing, and the only error is
// PostgreSQL refusing a string it cannot store as text (invalid UTF-8, NUL).
func FuzzFilterIsLiteral(f *testing.F) {
	for _, s := range [][2]string{
		{"q", "t"}, {"q%", ""}, {"", "t_"}, {"q' OR '1'='1", "t"}, {"'; DROP TABLE pgoutbox.effects; --", ""},
		{`q"`, `\`}, {"Q", "T"}, {"q ", " t"}, {"q\x00", ""}, {"\xff", "t"}, {"_", "%"}, {"$1", "$2"},
	} {
		f.Add(s[0], s[1])
	}
	pool, _ := pgtest.NewPool(f)
	ctx := context.Background()
	// Queues and types that a pattern or a case-insensitive match would
	// confuse with the literal ones.
	_, err := pool.Exec(ctx, `
		INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts, available_at,
		    leased_at, lease_owner, lease_token, lease_expires_at, dead_lettered_at)
		SELECT q, t, q || '|' || t || '|' || s, s::pgoutbox.effect_state,
		    CASE WHEN s = 'available' THEN 0 ELSE 8 END, now() - interval '1 hour',
		    CASE WHEN s = 'leased' THEN now() - interval '1 hour' END,
		    CASE WHEN s = 'leased' THEN 'stalled-worker' END,
		    CASE WHEN s = 'leased' THEN gen_random_uuid() END,
		    CASE WHEN s = 'leased' THEN now() + interval '1 hour' END,
		    CASE WHEN s = 'dead_letter' THEN now() END
		FROM unnest(ARRAY['q', 'q%', 'Q', 'q2', '_']) q, unnest(ARRAY['t', 't_', 'T']) t,
		     unnest(ARRAY['available', 'leased', 'dead_letter']) s`)
	if err != nil {
		f.Fatal(err)
	}
	fingerprint := func(t *testing.T) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT md5(string_agg(e::text, ',' ORDER BY id)) FROM pgoutbox.effects e`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := ""
	f.Fuzz(func(t *testing.T, queue, typ string) {
		if before == "" {
			before = fingerprint(t)
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		filter := ops.Filter{Queue: queue, Type: typ}
		storable := func(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
		check := func(what string, err error) bool {
			t.Helper()
			if err == nil {
				return true
			}
			if storable(queue) && storable(typ) {
				t.Fatalf("%s with filter %+v: %v", what, filter, err)
			}
			return false
		}
		match := func(what, q, ty string) {
			t.Helper()
			if (queue != "" && q != queue) || (typ != "" && ty != typ) {
				t.Fatalf("%s with filter %+v returned queue %q type %q", what, filter, q, ty)
			}
		}
		snap, err := ops.Status(ctx, pool, ops.StatusOptions{Filter: filter, StalledAfter: time.Minute})
		if check("status", err) {
			for _, c := range snap.Types {
				match("status", c.Queue, c.Type)
			}
		}
		page, err := ops.ListDeadLetters(ctx, pool, filter, 0, 1000)
		if check("dlq list", err) {
			for _, d := range page.Items {
				match("dlq list", d.Queue, d.Type)
			}
			seededQ := map[string]bool{"": true, "q": true, "q%": true, "Q": true, "q2": true, "_": true}
			seededT := map[string]bool{"": true, "t": true, "t_": true, "T": true}
			if seededQ[queue] && seededT[typ] && len(page.Items) == 0 {
				t.Fatalf("dlq list with filter %+v found nothing; every seeded queue and type has a dead letter", filter)
			}
		}
		replay, err := ops.ReplayDeadLetters(ctx, pool, ops.ReplayOptions{Filter: filter, DryRun: true, Limit: 1000})
		if check("dlq replay --dry-run", err) {
			for _, m := range replay.Replayed {
				match("dlq replay --dry-run", m.Queue, m.Type)
			}
		}
		requeue, err := ops.RequeueStale(ctx, pool, ops.RequeueOptions{Filter: filter, DryRun: true, StalledAfter: time.Minute})
		if check("requeue-stale --dry-run", err) {
			for _, m := range requeue.Requeued {
				match("requeue-stale --dry-run", m.Queue, m.Type)
			}
		}
		if after := fingerprint(t); after != before {
			t.Fatalf("filter %+v: a dry run changed the effects table", filter)
		}
	})
}
