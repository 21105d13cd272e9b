package controlplane_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// replayRow is one row of boardreadyops_replay_control_plane_outbox(max_rows, ids).
type replayRow struct {
	ID      int64
	Type    *string
	Outcome string
	State   string
	Reason  *string
}

func (r replayRow) String() string {
	reason := "<nil>"
	if r.Reason != nil {
		reason = *r.Reason
	}
	return fmt.Sprintf("%d %s %s (%s)", r.ID, r.Outcome, r.State, reason)
}

// replayFixture enqueues, in control_plane_outbox, dead letters dead[0..2],
// a reconciliation record, an available effect, and a dead letter in
// another queue, and returns their ids by name.
func replayFixture(t *testing.T, b *bundle) map[string]int64 {
	t.Helper()
	must(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(b.ctx, tx, []pgoutbox.Effect{
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "dead0"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "dead1"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "dead2"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeWorkflowDispatch, Key: "recon"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "avail"},
			{Queue: "other_queue", Type: "x", Key: "elsewhere"},
		})
		return err
	}))
	_, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET attempts = 8,
		state = CASE idempotency_key WHEN 'recon' THEN 'reconciliation_required' WHEN 'avail' THEN 'available' ELSE 'dead_letter' END::pgoutbox.effect_state,
		delivery_started_at = CASE WHEN idempotency_key = 'recon' THEN now() END`)
	must(t, err)
	ids := map[string]int64{}
	rows, err := b.pool.Query(b.ctx, `SELECT idempotency_key, id FROM pgoutbox.effects`)
	must(t, err)
	for rows.Next() {
		var k string
		var id int64
		must(t, rows.Scan(&k, &id))
		ids[k] = id
	}
	must(t, rows.Err())
	return ids
}

func (b *bundle) replayByIDs(t *testing.T, sql string, args ...any) []replayRow {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, sql, args...)
	must(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (replayRow, error) {
		var x replayRow
		err := r.Scan(&x.ID, &x.Type, &x.Outcome, &x.State, &x.Reason)
		return x, err
	})
	must(t, err)
	return out
}

// effectsDigest is every effect row, to prove that a call changed nothing.
func (b *bundle) effectsDigest(t *testing.T) string {
	t.Helper()
	var s string
	must(t, b.pool.QueryRow(b.ctx, `SELECT coalesce(md5(string_agg(to_jsonb(e)::text, ',' ORDER BY id)), '-') FROM pgoutbox.effects e`).Scan(&s))
	return s
}

// TestReplayFunctionByIDsReportsSkipped: the new form replays exactly the
// requested dead letters of control_plane_outbox and says why each other
// requested id did not move (issue 17, point 5).
func TestReplayFunctionByIDsReportsSkipped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	ids := replayFixture(t, b)
	const missing = 987654321
	got := b.replayByIDs(t, `SELECT * FROM boardreadyops_replay_control_plane_outbox(100, $1::bigint[])`,
		[]int64{ids["dead1"], ids["recon"], ids["avail"], ids["elsewhere"], missing, ids["dead1"]})
	want := map[int64][2]string{
		ids["dead1"]:     {"replayed", "available"},
		ids["recon"]:     {"skipped", "reconciliation_required"},
		ids["avail"]:     {"skipped", "available"},
		ids["elsewhere"]: {"skipped", "dead_letter"},
		missing:          {"skipped", "missing"},
	}
	reasons := map[int64]string{
		ids["recon"]: "reconciliation record", ids["avail"]: "not a dead letter",
		ids["elsewhere"]: "not in queue control_plane_outbox", missing: "no such effect",
	}
	if len(got) != len(want) {
		t.Fatalf("rows %v, want one per distinct requested id (%d)", got, len(want))
	}
	for _, r := range got {
		w, ok := want[r.ID]
		if !ok || r.Outcome != w[0] || r.State != w[1] {
			t.Errorf("row %v, want %v", r, w)
		}
		if want := reasons[r.ID]; want != "" && (r.Reason == nil || !strings.Contains(*r.Reason, want)) {
			t.Errorf("row %v: reason should say %q", r, want)
		}
	}
	for k, state := range map[string]string{"dead0": "dead_letter", "dead1": "available", "dead2": "dead_letter",
		"recon": "reconciliation_required", "elsewhere": "dead_letter"} {
		if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state::text = $2`, ids[k], state); n != 1 {
			t.Errorf("%s is not %s after the replay", k, state)
		}
	}
	if n := b.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE id = $1`, ids["dead1"]); n != 0 {
		t.Errorf("replayed with %d attempts, want fresh (0)", n)
	}

	// Without ids: the oldest dead letters up to max_rows, and the queue's
	// reconciliation records reported as skipped.
	got = b.replayByIDs(t, `SELECT * FROM boardreadyops_replay_control_plane_outbox(1, NULL)`)
	if len(got) != 2 || got[0].ID != ids["dead0"] || got[0].Outcome != "replayed" ||
		got[1].ID != ids["recon"] || got[1].Outcome != "skipped" || got[1].State != "reconciliation_required" {
		t.Fatalf("replay of any, max_rows 1: %v", got)
	}
}

// TestReplayFunctionBadArgumentsChangeNothing: max_rows < 1, an empty ids
// array or a NULL id raise invalid_parameter_value with a clear message,
// and nothing changes.
func TestReplayFunctionBadArgumentsChangeNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	ids := replayFixture(t, b)
	before := b.effectsDigest(t)
	for _, c := range []struct {
		sql  string
		args []any
		want string
	}{
		{`SELECT * FROM boardreadyops_replay_control_plane_outbox(0, $1::bigint[])`, []any{[]int64{ids["dead0"]}}, "max_rows must be at least 1, got 0"},
		{`SELECT * FROM boardreadyops_replay_control_plane_outbox(NULL, NULL)`, nil, "max_rows must be at least 1, got NULL"},
		{`SELECT * FROM boardreadyops_replay_control_plane_outbox(100, '{}')`, nil, "non-empty array"},
		{`SELECT * FROM boardreadyops_replay_control_plane_outbox(100, ARRAY[$1, NULL]::bigint[])`, []any{ids["dead0"]}, "without NULL"},
	} {
		rows, err := b.pool.Query(b.ctx, c.sql, c.args...)
		if err == nil {
			rows.Close()
			err = rows.Err()
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22023" || !strings.Contains(pgErr.Message, c.want) {
			t.Errorf("%s: %v, want SQLSTATE 22023 saying %q", c.sql, err, c.want)
		}
	}
	// The old one-argument form still resolves, with a NULL or a negative
	// count too (both replay nothing, as before).
	for _, call := range []string{`SELECT boardreadyops_replay_control_plane_outbox(NULL)`,
		`SELECT boardreadyops_replay_control_plane_outbox(-1)`, `SELECT boardreadyops_replay_control_plane_outbox(max_rows => 0)`} {
		var n int64
		if err := b.pool.QueryRow(b.ctx, call).Scan(&n); err != nil || n != 0 {
			t.Errorf("%s: %d %v, want 0", call, n, err)
		}
	}
	if after := b.effectsDigest(t); after != before {
		t.Fatal("a refused call changed the effects")
	}
}

// TestReplayFunctionLockedDeadLetterIsReported: a requested dead letter
// that another transaction holds locked is skipped, not waited for, and
// reported as such; the other requested one moves.
func TestReplayFunctionLockedDeadLetterIsReported(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	ids := replayFixture(t, b)
	holder, err := b.pool.Begin(b.ctx)
	must(t, err)
	defer func() { _ = holder.Rollback(b.ctx) }()
	_, err = holder.Exec(b.ctx, `SELECT 1 FROM pgoutbox.effects WHERE id = $1 FOR UPDATE`, ids["dead2"])
	must(t, err)
	got := b.replayByIDs(t, `SELECT * FROM boardreadyops_replay_control_plane_outbox(100, $1::bigint[])`, []int64{ids["dead0"], ids["dead2"]})
	if len(got) != 2 || got[0].ID != ids["dead0"] || got[0].Outcome != "replayed" ||
		got[1].ID != ids["dead2"] || got[1].Outcome != "skipped" || got[1].State != "dead_letter" ||
		got[1].Reason == nil || !strings.Contains(*got[1].Reason, "locked") {
		t.Fatalf("rows %v", got)
	}
}

// TestReplayFunctionWakesWorkers: both forms NOTIFY the queue's workers
// when they replay something, and not when they replay nothing. Ordering
// is deterministic: notifications arrive in commit order, so a sentinel
// NOTIFY sent after a call arrives first exactly when the call sent none.
func TestReplayFunctionWakesWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	ids := replayFixture(t, b)
	listener, err := b.pool.Acquire(b.ctx)
	must(t, err)
	defer listener.Release()
	_, err = listener.Exec(b.ctx, `LISTEN pgoutbox_effects; LISTEN replay_test_sentinel`)
	must(t, err)
	next := func(what string) *pgconn.Notification {
		t.Helper()
		n, err := listener.Conn().WaitForNotification(b.ctx)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return n
	}
	sentinel := func() {
		t.Helper()
		_, err := b.pool.Exec(b.ctx, `SELECT pg_notify('replay_test_sentinel', 'x')`)
		must(t, err)
	}
	for i, call := range []string{
		`SELECT count(*) FROM boardreadyops_replay_control_plane_outbox(100, ARRAY[` + fmt.Sprint(ids["dead0"]) + `])`,
		`SELECT boardreadyops_replay_control_plane_outbox(100)`,
	} {
		var n int64
		must(t, b.pool.QueryRow(b.ctx, call).Scan(&n))
		sentinel()
		if n == 0 {
			t.Fatalf("call %d moved nothing", i)
		}
		if got := next(call); got.Channel != "pgoutbox_effects" || got.Payload != controlplane.QueueOutbox {
			t.Fatalf("after %s: notification %s/%s first, want pgoutbox_effects/%s (the workers were not woken)",
				call, got.Channel, got.Payload, controlplane.QueueOutbox)
		}
		if got := next("sentinel"); got.Channel != "replay_test_sentinel" {
			t.Fatalf("after %s: a second notification %s/%s", call, got.Channel, got.Payload)
		}
	}
	// Nothing left to replay: no notification before the sentinel.
	var n int64
	must(t, b.pool.QueryRow(b.ctx, `SELECT boardreadyops_replay_control_plane_outbox(100)`).Scan(&n))
	sentinel()
	if n != 0 {
		t.Fatalf("second replay moved %d", n)
	}
	if got := next("sentinel"); got.Channel != "replay_test_sentinel" {
		t.Fatalf("a replay of nothing notified %s/%s", got.Channel, got.Payload)
	}
}
