package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The worker functions of migration 00025 run the engine's own statements:
// each pgoutbox.work_*_rows function's body is this package's statement,
// verbatim (whitespace aside). A change to one of these statements needs a
// new migration that replaces the function with the new text; until then
// this test fails and names the function.
func TestWorkerFunctionsRunTheEngineStatements(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The pause check of migration 00023 is not yet in work_claim_rows:
	// 00025 created the function after 00023 existed, and replacing it
	// needs a migration numbered after 00025 (not assigned yet). Until
	// then the function runs the claim without it: SQL workers claim from a
	// paused queue (docs/console.md says so). That migration must
	// CREATE OR REPLACE work_claim_rows with claimSQL and drop this cut.
	claimBeforePause := strings.Replace(claimSQL, "AND "+notPausedSQL, "", 1)
	if claimBeforePause == claimSQL {
		t.Fatal("claimSQL has no pause check: drop claimBeforePause and compare with claimSQL")
	}
	for fn, stmt := range map[string]string{
		"work_claim_rows":    claimBeforePause,
		"work_start_row":     startSQL + "\nRETURNING id",
		"work_complete_rows": completeSQL,
		"work_fail_row":      failSQL,
		"work_extend_rows":   extendSQL,
		"work_sweep_rows":    sweepSQL,
	} {
		var body string
		err := pool.QueryRow(ctx, `SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE n.nspname = 'pgoutbox' AND p.proname = $1`, fn).Scan(&body)
		if err != nil {
			t.Fatalf("pgoutbox.%s: %v", fn, err)
		}
		if got, want := strings.Join(strings.Fields(body), " "), strings.Join(strings.Fields(stmt), " "); got != want {
			t.Errorf("pgoutbox.%s no longer runs the engine's statement: a new migration must replace it (CREATE OR REPLACE) with\n%s\nits body is\n%s",
				fn, stmt, body)
		}
	}
}
