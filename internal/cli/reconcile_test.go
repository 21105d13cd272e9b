package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/cli"
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
		        '{"release_run_id": 1, "execution_attempt_id": 2, "repository": "acme/api", "workflow": "release.yml", "ref": "refs/tags/v1"}',
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
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != recID || list[0].Dispatch.ReleaseRunID != 1 {
		t.Fatalf("reconcile list --json: %d %q %q", code, out, errs)
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
}
