package ops_test

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// compact gives back the space of deleted effects (heap tail and index
// pages), changes no row, and leaves every index valid; --dry-run only
// measures.
func TestCompact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live := seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "available"}, eff{queue: "q", typ: "t", state: "dead_letter"})
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
		 SELECT 'burst', 't', 'k-' || g, jsonb_build_object('pad', repeat('x', 300)) FROM generate_series(1, 20000) g`,
		`DELETE FROM pgoutbox.effects WHERE queue = 'burst'`,     // what retention does to completed effects
		`DELETE FROM pgoutbox.effect_keys WHERE queue = 'burst'`, // and key retention to their keys
		`VACUUM pgoutbox.effects, pgoutbox.effect_keys`,
	} {
		if _, err := b.pool.Exec(b.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rows := b.fingerprint(t)

	var dry ops.CompactResult
	b.runJSON(t, nil, 0, &dry, "compact", "--dry-run")
	if !dry.DryRun || len(dry.Relations) < 4 || dry.BytesBefore != dry.BytesAfter {
		t.Fatalf("dry run: %+v", dry)
	}
	var res ops.CompactResult
	b.runJSON(t, nil, 0, &res, "compact")
	if res.BytesBefore != dry.BytesBefore {
		t.Fatalf("the dry run changed the sizes: %d then %d bytes", dry.BytesBefore, res.BytesBefore)
	}
	// 20,000 deleted effects left about 3 MB of index pages; two live rows
	// need a few pages per relation.
	if res.BytesBefore < 2<<20 || res.BytesAfter > res.BytesBefore/10 {
		t.Fatalf("compacted %d to %d bytes, want at least 2 MiB to under a tenth", res.BytesBefore, res.BytesAfter)
	}
	names := map[string]bool{}
	for _, r := range res.Relations {
		names[r.Name] = true
		if r.BytesAfter > r.BytesBefore {
			t.Errorf("%s grew from %d to %d bytes", r.Name, r.BytesBefore, r.BytesAfter)
		}
	}
	for _, n := range []string{"pgoutbox.effects", "pgoutbox.effects_pkey", "pgoutbox.effects_claim_idx", "pgoutbox.effect_keys", "pgoutbox.effect_keys_pkey"} {
		if !names[n] {
			t.Errorf("%s missing from %v", n, names)
		}
	}
	if after := b.fingerprint(t); after != rows {
		t.Fatal("compact changed rows")
	}
	var bad int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid IN ('pgoutbox.effects'::regclass, 'pgoutbox.effect_keys'::regclass)
		  AND (NOT i.indisvalid OR c.relname LIKE '%ccnew%' OR c.relname LIKE '%ccold%')`).Scan(&bad); err != nil || bad != 0 {
		t.Fatalf("%d invalid or leftover indexes after compact (%v)", bad, err)
	}
	if got := b.state(t, live[0]); got != "available" {
		t.Fatalf("live effect is %s", got)
	}

	r := b.run(t, nil, "compact")
	if r.code != 0 || !strings.Contains(r.stdout, "compacted ") || !strings.Contains(r.stdout, "pgoutbox.effect_keys_pkey") {
		t.Fatalf("human output (exit %d):\n%s%s", r.code, r.stdout, r.stderr)
	}
	columnsAligned(t, strings.SplitN(r.stdout, "\ncompacted", 2)[0])
}
