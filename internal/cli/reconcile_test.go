package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestReconcileCommands(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var recID, deadID int64
	if err := conn.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, attempts, delivery_started_at, reconciliation_at)
		VALUES ('control_plane_outbox', 'github.workflow.dispatch', 'k1',
		        '{"release_run_id": 1, "execution_attempt_id": 2, "attempt_number": 1, "repository": "acme/api", "workflow": "release.yml", "ref": "refs/tags/v1"}',
		        'reconciliation_required', 1, now(), now()) RETURNING id`).Scan(&recID); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts)
		VALUES ('control_plane_outbox', 'github.workflow.dispatch', 'k2', 'dead_letter', 8) RETURNING id`).Scan(&deadID); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run(t, "--database-url", dsn, "reconcile", "list", "--json")
	var list []struct {
		ID       int64 `json:"id"`
		Dispatch struct {
			ReleaseRunID int64 `json:"release_run_id"`
		} `json:"dispatch"`
		Subject ops.Subject `json:"subject"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != recID || list[0].Dispatch.ReleaseRunID != 1 ||
		list[0].Subject != (ops.Subject{Repository: "acme/api", ReleaseRunID: 1, ExecutionAttemptID: 2, AttemptNumber: 1}) {
		t.Fatalf("reconcile list --json: %d %q %q", code, out, errs)
	}
	// The text listing names the subject: repository, release run, attempt
	// (issue 17, point 4).
	code, out, errs = run(t, "--database-url", dsn, "reconcile", "list")
	if code != 0 || !regexp.MustCompile(`(?m)^ID +TYPE +REPOSITORY +RELEASE RUN +ATTEMPT +STARTED +LAST ERROR\n`+
		strconv.FormatInt(recID, 10)+` +github.workflow.dispatch +acme/api +1 +2 \(#1\) +\S+ ago +-$`).MatchString(out) {
		t.Fatalf("reconcile list: %d %q %q", code, out, errs)
	}
	if code, _, errs := run(t, "--database-url", dsn, "reconcile", "list", "--limit", "0"); code != cli.ExitCouldNotRun ||
		!strings.Contains(errs, "--limit must be positive") {
		t.Fatalf("reconcile list --limit 0: %d %q", code, errs)
	}
	// A record that is not reconciliation_required is refused: exit 3, nothing changed.
	code, _, _ = run(t, "--database-url", dsn, "reconcile", "resolve", strconv.FormatInt(deadID, 10), "--workflow-run-id", "5")
	if code != cli.ExitCheckFailed {
		t.Fatalf("resolve of a dead letter: exit %d, want 3", code)
	}
	code, _, _ = run(t, "--database-url", dsn, "reconcile", "supersede", strconv.FormatInt(deadID, 10), "--reason", "x")
	if code != cli.ExitCheckFailed {
		t.Fatalf("supersede of a dead letter: exit %d, want 3", code)
	}
	var state string
	if err := conn.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, deadID).Scan(&state); err != nil || state != "dead_letter" {
		t.Fatalf("dead letter changed: %s %v", state, err)
	}
	if code, _, _ := run(t, "--database-url", dsn, "reconcile", "resolve", "abc", "--workflow-run-id", "5"); code != cli.ExitCouldNotRun {
		t.Fatalf("bad id: exit %d, want 1", code)
	}
	// resolve checks the run against GitHub (issue 17, point 6): without
	// the App settings it cannot, says so, and changes nothing; --force
	// resolves without the check.
	if os.Getenv("GITHUB_APP_ID") == "" {
		code, _, errs = run(t, "--database-url", dsn, "reconcile", "resolve", strconv.FormatInt(recID, 10), "--workflow-run-id", "5")
		if code != cli.ExitCouldNotRun || !strings.Contains(errs, "GITHUB_APP_ID") {
			t.Fatalf("resolve without GitHub: %d %q", code, errs)
		}
		if err := conn.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, recID).Scan(&state); err != nil || state != "reconciliation_required" {
			t.Fatalf("record changed by a refused resolve: %s %v", state, err)
		}
	}
	code, out, errs = run(t, "--database-url", dsn, "reconcile", "resolve", strconv.FormatInt(recID, 10), "--workflow-run-id", "5", "--force")
	if code != 0 || !strings.Contains(out, "not checked: --force") {
		t.Fatalf("resolve --force: %d %q %q", code, out, errs)
	}
	if err := conn.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1 AND resolution->>'verified' = 'false'`, recID).Scan(&state); err != nil || state != "completed" {
		t.Fatalf("after resolve --force: %s %v", state, err)
	}
}
