package cli_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestLogFlagsRefused: a level or format the logger would not honour is
// refused before the command runs, not replaced by info/text in silence.
func TestLogFlagsRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}} {
		code, out, errs := run(t, append(args, "version")...)
		if code != cli.ExitCouldNotRun || out != "" || !strings.Contains(errs, args[0]) || !strings.Contains(errs, args[1]) {
			t.Errorf("%v version: exit %d, stdout %q, stderr %q; want exit 1 naming the flag and its value", args, code, out, errs)
		}
	}
	for _, args := range [][]string{{"--log-level", "debug"}, {"--log-level", "WARN"}, {"--log-format", "json"}} {
		if code, _, errs := run(t, append(args, "version")...); code != cli.ExitOK {
			t.Errorf("%v version: exit %d %q, want 0", args, code, errs)
		}
	}
}

// TestDLQReplayNamesUnknownFilters: `dlq replay --queue` of a queue with no
// effects at all is a misspelling, refused with exit 1; a queue with effects
// but no dead letters replays 0 and exits 0; a dry run shows the state the
// rows are in and the one they would move to.
func TestDLQReplayNamesUnknownFilters(t *testing.T) {
	t.Parallel()
	conn, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts)
		VALUES ('emails', 'email.send', 'k1', 'available', 0), ('hooks', 'hook.post', 'k2', 'dead_letter', 8)`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--queue", "nosuchqueue"}, {"--effect-type", "no.such.type"}, {"--queue", "emails", "--effect-type", "hook.post"}} {
		code, out, errs := run(t, append([]string{"--database-url", dsn, "dlq", "replay"}, args...)...)
		if code != cli.ExitCouldNotRun || !strings.Contains(errs, "no effects of") || !strings.Contains(errs, args[1]) {
			t.Errorf("dlq replay %v: exit %d, stdout %q, stderr %q; want exit 1 naming the filter", args, code, out, errs)
		}
	}
	code, out, errs := run(t, "--database-url", dsn, "dlq", "replay", "--queue", "emails")
	if code != cli.ExitOK || !strings.Contains(out, "replayed 0") {
		t.Errorf("dlq replay --queue emails (no dead letters): exit %d %q %q, want 0 and replayed 0", code, out, errs)
	}
	code, out, errs = run(t, "--database-url", dsn, "dlq", "replay", "--queue", "hooks", "--dry-run")
	if code != cli.ExitOK || !strings.Contains(out, "dead_letter → available") || !strings.Contains(out, "would replay (dry run) 1") {
		t.Errorf("dlq replay --dry-run: exit %d %q %q, want the row shown as dead_letter → available", code, out, errs)
	}
	if n := pgtest.Scalar(t, ctx, conn, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`); n != 1 {
		t.Errorf("after the dry run: %d dead letters, want 1 (nothing changed)", n)
	}
}

// TestReconcileInspectSaysWhy: inspect, resolve and supersede of an id that
// is not a reconciliation record say what it is, before any GitHub setting
// is needed: an unknown id exits 1; a completed dispatch is not a problem
// for inspect (exit 0) and is refused by resolve and supersede (exit 1); a
// dead letter exits 3 and points at dlq replay. Nothing changes.
func TestReconcileInspectSaysWhy(t *testing.T) {
	t.Parallel()
	conn, dsn := pgtest.NewPool(t)
	ctx := context.Background()
	var doneID, deadID int64
	if err := conn.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, attempts, delivery_started_at)
		VALUES ('control_plane_outbox', 'github.workflow.dispatch', 'k1', '{}', 'completed', 1, now()) RETURNING id`).Scan(&doneID); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts)
		VALUES ('control_plane_outbox', 'github.workflow.dispatch', 'k2', 'dead_letter', 8) RETURNING id`).Scan(&deadID); err != nil {
		t.Fatal(err)
	}
	db := []string{"--database-url", dsn, "reconcile"}
	cases := []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"inspect", "999999"}, cli.ExitCouldNotRun, "", "no effect 999999"},
		{[]string{"resolve", "999999", "--workflow-run-id", "5"}, cli.ExitCouldNotRun, "", "no effect 999999"},
		{[]string{"supersede", "999999", "--reason", "x"}, cli.ExitCouldNotRun, "", "no effect 999999"},
		{[]string{"inspect", strconv.FormatInt(doneID, 10)}, cli.ExitOK, "is completed", ""},
		{[]string{"resolve", strconv.FormatInt(doneID, 10), "--workflow-run-id", "5"}, cli.ExitCouldNotRun, "", "is completed"},
		{[]string{"supersede", strconv.FormatInt(doneID, 10), "--reason", "x"}, cli.ExitCouldNotRun, "", "is completed"},
		{[]string{"inspect", strconv.FormatInt(deadID, 10)}, cli.ExitCheckFailed, "", "dlq replay"},
	}
	for _, c := range cases {
		code, out, errs := run(t, append(db, c.args...)...)
		if code != c.code || !strings.Contains(out, c.out) || !strings.Contains(errs, c.err) || strings.Contains(errs, "GITHUB_APP") {
			t.Errorf("reconcile %v: exit %d, stdout %q, stderr %q; want exit %d, %q / %q", c.args, code, out, errs, c.code, c.out, c.err)
		}
	}
	if n := pgtest.Scalar(t, ctx, conn, `SELECT count(*) FROM pgoutbox.effects WHERE (id = $1 AND state = 'completed') OR (id = $2 AND state = 'dead_letter')`,
		doneID, deadID); n != 2 {
		t.Errorf("records changed: %d of 2 as they were", n)
	}
}
