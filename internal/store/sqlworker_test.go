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
// statement, verbatim (whitespace aside; 00032's run it from PL/pgSQL). A change to one of these
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
		var body, lang string
		err := pool.QueryRow(ctx, `SELECT p.prosrc, l.lanname FROM pg_proc p
			JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
			WHERE n.nspname = 'pgoutbox' AND p.proname = $1`, fn).Scan(&body, &lang)
		if err != nil {
			t.Fatalf("pgoutbox.%s: %v", fn, err)
		}
		got := strings.Join(strings.Fields(body), " ")
		if lang == "plpgsql" {
			// The batch path's functions (migration 00032): PL/pgSQL keeps
			// the statement's plan for the session.
			for _, wrap := range [][2]string{{"BEGIN RETURN QUERY ", "; END;"}, {"BEGIN ", "; END;"}} {
				if strings.HasPrefix(got, wrap[0]) && strings.HasSuffix(got, wrap[1]) {
					got = strings.TrimSuffix(strings.TrimPrefix(got, wrap[0]), wrap[1])
					break
				}
			}
		} else if !strings.HasSuffix(fn, "_rows") && !strings.HasSuffix(fn, "_row") {
			t.Errorf("pgoutbox.%s is LANGUAGE %s, want plpgsql (migration 00032)", fn, lang)
		}
		if want := strings.Join(strings.Fields(stmt), " "); got != want {
			t.Errorf("pgoutbox.%s no longer runs the engine's statement: a new migration must replace it (CREATE OR REPLACE) with\n%s\nits body is\n%s",
				fn, stmt, body)
		}
	}
}
