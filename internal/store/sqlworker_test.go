package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The worker functions of migrations 00025 and 00032 run the engine's own
// statements: each pgoutbox.work_* function's body is this package's
// statement, verbatim (whitespace aside). A change to one of these
// statements needs a new migration that replaces the function with the new
// text; until then this test fails and names the function.
func TestWorkerFunctionsRunTheEngineStatements(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for fn, stmt := range map[string]string{
		"work_claim_rows":    claimSQL,
		"work_start_row":     startSQL + "\nRETURNING id",
		"work_complete_rows": completeSQL,
		"work_fail_row":      failSQL,
		"work_extend_rows":   extendSQL,
		"work_sweep_rows":    sweepSQL,
		// Migration 00032: the batch workers.
		"work_claim_batch":      claimBatchSQL,
		"work_held_keys":        heldKeysSQL,
		"work_settle_batch_row": settleFenceSQL + "\nRETURNING id",
		"work_move_rows":        moveSQL,
		"work_page_settled":     settledSQL,
		"work_release_batch":    releaseBatchSQL + "\nRETURNING id",
		"work_extend_batch":     extendBatchSQL + "\nRETURNING id",
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
