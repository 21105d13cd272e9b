package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func TestListDeadLettersPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "a", typ: "x", state: "dead_letter", attempts: 8, completedAgo: 50, lastError: "boom 1"},
		eff{queue: "a", typ: "y", state: "dead_letter", attempts: 3, maxAttempts: 3, completedAgo: 40, lastError: "boom 2"},
		eff{queue: "b", typ: "x", state: "dead_letter", attempts: 1, completedAgo: 30, lastError: "permanent"},
		eff{queue: "a", typ: "x", state: "reconciliation_required", attempts: 1, leasedAgo: 5, started: true},
		eff{queue: "a", typ: "x", state: "available"},
		eff{queue: "a", typ: "x", state: "dead_letter", attempts: 8, completedAgo: 20, lastError: "boom 3"},
	)
	page, err := ops.ListDeadLetters(b.ctx, b.pool, ops.Filter{}, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 2 || page.Items[0].ID != ids[0] || page.Items[1].ID != ids[1] ||
		page.NextAfterID == nil || *page.NextAfterID != ids[1] {
		t.Fatalf("page 1: %+v next %v", page.Items, page.NextAfterID)
	}
	d := page.Items[1]
	if d.Queue != "a" || d.Type != "y" || d.Attempts != 3 || d.MaxAttempts != 3 || d.LastError != "boom 2" ||
		d.DeadLetteredAt == nil {
		t.Fatalf("item: %+v", d)
	}
	page, err = ops.ListDeadLetters(b.ctx, b.pool, ops.Filter{}, *page.NextAfterID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 2 || page.Items[0].ID != ids[2] || page.Items[1].ID != ids[5] || page.NextAfterID != nil {
		t.Fatalf("page 2: %+v next %v", page.Items, page.NextAfterID)
	}
	page, err = ops.ListDeadLetters(b.ctx, b.pool, ops.Filter{Queue: "a", Type: "x"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 2 || page.Items[0].ID != ids[0] || page.Items[1].ID != ids[5] {
		t.Fatalf("filtered: %+v", page.Items)
	}
}

func TestReplayNeverTouchesReconciliation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "gh", typ: "github.workflow.dispatch", state: "dead_letter", attempts: 8, leasedAgo: 100, started: true, lastError: "422"},
		eff{queue: "gh", typ: "github.check_run.create", state: "dead_letter", attempts: 8, completedAgo: 10},
		eff{queue: "gh", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 100, started: true},
		eff{queue: "gh", typ: "github.check_run.create", state: "completed", attempts: 1, completedAgo: 5},
		eff{queue: "other", typ: "x", state: "dead_letter", attempts: 8, completedAgo: 10},
	)
	recon := ids[2]
	reconBefore, completedBefore := b.rowJSON(t, recon), b.rowJSON(t, ids[3])

	// Asking for the reconciliation record by id: reported, untouched.
	res, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{IDs: []int64{recon, ids[3], 999999}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Replayed) != 0 || len(res.Skipped) != 3 || res.Skipped[0].ID != ids[2] ||
		res.Skipped[0].State != "reconciliation_required" || res.Skipped[1].State != "completed" ||
		res.Skipped[2].State != "missing" {
		t.Fatalf("by id: %+v", res)
	}

	// A dry run changes nothing.
	before := b.fingerprint(t)
	res, err = ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Filter: ops.Filter{Queue: "gh"}, DryRun: true})
	if err != nil || len(res.Replayed) != 2 || !res.DryRun {
		t.Fatalf("dry run: %v %+v", err, res)
	}
	if b.fingerprint(t) != before {
		t.Fatal("a dry run changed the tables")
	}

	// Replay the queue, listening for the wake-up.
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(b.ctx, "LISTEN pgoutbox_effects"); err != nil {
		t.Fatal(err)
	}
	res, err = ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Filter: ops.Filter{Queue: "gh"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Replayed) != 2 || res.Replayed[0].ID != ids[0] || res.Replayed[1].ID != ids[1] || len(res.Skipped) != 0 {
		t.Fatalf("replay: %+v", res)
	}
	n, err := conn.Conn().WaitForNotification(b.ctx)
	if err != nil || n.Payload != "gh" {
		t.Fatalf("notification: %v %+v", err, n)
	}
	for _, id := range ids[:2] {
		var state string
		var attempts int
		var started, dead *time.Time
		err := b.pool.QueryRow(b.ctx, `SELECT state::text, attempts, delivery_started_at, dead_lettered_at
			FROM pgoutbox.effects WHERE id = $1 AND available_at <= now()`, id).Scan(&state, &attempts, &started, &dead)
		if err != nil || state != "available" || attempts != 0 || started != nil || dead != nil {
			t.Fatalf("replayed %d: %v %s attempts=%d started=%v dead=%v", id, err, state, attempts, started, dead)
		}
	}
	if b.rowJSON(t, recon) != reconBefore || b.rowJSON(t, ids[3]) != completedBefore {
		t.Fatal("replay touched a record that is not a dead letter")
	}
	if b.state(t, ids[4]) != "dead_letter" {
		t.Fatal("replay of queue gh moved a dead letter of another queue")
	}

	// Replay everything: only the remaining dead letter moves.
	res, err = ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{})
	if err != nil || len(res.Replayed) != 1 || res.Replayed[0].ID != ids[4] {
		t.Fatalf("replay all: %v %+v", err, res)
	}
	if b.rowJSON(t, recon) != reconBefore {
		t.Fatal("replay of everything touched the reconciliation record")
	}
}

func TestReplayBatchLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var effs []eff
	for range 5 {
		effs = append(effs, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1})
	}
	ids := seed(t, b.ctx, b.pool, effs...)
	res, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Limit: 3})
	if err != nil || len(res.Replayed) != 3 || res.Limit != 3 {
		t.Fatalf("%v %+v", err, res)
	}
	for i, id := range ids {
		want := "available"
		if i >= 3 {
			want = "dead_letter"
		}
		if got := b.state(t, id); got != want {
			t.Fatalf("effect %d: %s, want %s (oldest first)", i, got, want)
		}
	}
	// Default limit when unset.
	res, err = ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Limit: 0})
	if err != nil || res.Limit != ops.ReplayBatchLimitDefault || len(res.Replayed) != 2 {
		t.Fatalf("%v %+v", err, res)
	}
}

func TestRequeueStaleRoutesStartedDispatchToReconciliation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	enqueue := func(typ, key string, maxAttempts int) {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "gh", Type: typ, Key: key, MaxAttempts: maxAttempts})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	enqueue("github.workflow.dispatch", "dispatch", 8)
	enqueue("github.check_run.create", "check", 8)
	enqueue("github.check_run.complete", "exhausted", 1)
	enqueue("github.check_run.complete", "fresh", 8)
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "gh", "stuck-worker", 4, time.Hour)
	if err != nil || len(leases) != 4 {
		t.Fatalf("claim: %v %d", err, len(leases))
	}
	byKey := map[string]*pgoutbox.Lease{}
	for _, l := range leases {
		byKey[l.Key] = l
	}
	if err := byKey["dispatch"].MarkStarted(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	// Three leases were taken 11 minutes ago (and extended since: their
	// leases have not expired); one 2 minutes ago.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET leased_at = now() - interval '11 minutes'
		WHERE idempotency_key <> 'fresh'`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET leased_at = now() - interval '2 minutes'
		WHERE idempotency_key = 'fresh'`); err != nil {
		t.Fatal(err)
	}
	fresh := b.rowJSON(t, byKey["fresh"].ID)

	before := b.fingerprint(t)
	res, err := ops.RequeueStale(b.ctx, b.pool, ops.RequeueOptions{StalledAfter: 10 * time.Minute, DryRun: true})
	if err != nil || len(res.Requeued) != 3 || b.fingerprint(t) != before {
		t.Fatalf("dry run: %v %+v (changed: %v)", err, res, b.fingerprint(t) != before)
	}
	res, err = ops.RequeueStale(b.ctx, b.pool, ops.RequeueOptions{StalledAfter: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]ops.Moved{}
	for _, m := range res.Requeued {
		got[m.ID] = m
	}
	for key, want := range map[string]string{
		"dispatch":  "reconciliation_required",
		"check":     "available",
		"exhausted": "dead_letter",
	} {
		id := byKey[key].ID
		if got[id].State != want || b.state(t, id) != want || got[id].LeaseOwner != "stuck-worker" ||
			got[id].LeaseHeldSeconds < 660 {
			t.Fatalf("%s: moved %+v, state %s; want %s", key, got[id], b.state(t, id), want)
		}
	}
	if len(res.Requeued) != 3 || b.rowJSON(t, byKey["fresh"].ID) != fresh {
		t.Fatalf("a lease younger than the stalled age was touched: %+v", res.Requeued)
	}
	// The stalled worker's lease is fenced off: its late writes change nothing.
	if err := byKey["check"].Complete(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("stale complete: %v", err)
	}
	if b.state(t, byKey["check"].ID) != "available" {
		t.Fatal("the stalled worker completed a requeued effect")
	}
	// A second run finds nothing more.
	res, err = ops.RequeueStale(b.ctx, b.pool, ops.RequeueOptions{StalledAfter: 10 * time.Minute})
	if err != nil || len(res.Requeued) != 0 {
		t.Fatalf("second run: %v %+v", err, res)
	}
}

func TestRequeueStaleFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "a", typ: "x", state: "leased", attempts: 1, leasedAgo: 3600},
		eff{queue: "a", typ: "y", state: "leased", attempts: 1, leasedAgo: 3600},
		eff{queue: "b", typ: "x", state: "leased", attempts: 1, leasedAgo: 3600},
	)
	res, err := ops.RequeueStale(context.Background(), b.pool, ops.RequeueOptions{Filter: ops.Filter{Queue: "a", Type: "x"}})
	if err != nil || len(res.Requeued) != 1 || res.Requeued[0].ID != ids[0] {
		t.Fatalf("%v %+v", err, res)
	}
	if b.state(t, ids[1]) != "leased" || b.state(t, ids[2]) != "leased" {
		t.Fatal("filters ignored")
	}
}

// TestReplayThenSharesTheTransaction: ReplayOptions.Then runs in the
// replay's transaction after the rows moved, so what it writes (the
// console's audit row) commits with the replay, and its error rolls the
// replay back.
func TestReplayThenSharesTheTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1})
	var seen int
	_, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Then: func(ctx context.Context, tx pgx.Tx, res *ops.ReplayResult) error {
		// Inside the transaction the row has moved already.
		var st string
		if err := tx.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&st); err != nil {
			return err
		}
		seen = len(res.Replayed)
		if st != "available" {
			return errors.New("Then ran before the replay: state " + st)
		}
		return errors.New("audit failed")
	}})
	if err == nil || seen != 1 || b.state(t, ids[0]) != "dead_letter" {
		t.Fatalf("err %v, Then saw %d replayed, state %s: want the error and the replay rolled back", err, seen, b.state(t, ids[0]))
	}
	_, err = ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Then: func(ctx context.Context, tx pgx.Tx, _ *ops.ReplayResult) error {
		_, err := tx.Exec(ctx, `INSERT INTO pgoutbox.console_audit (operator, session, action, changed) VALUES ('t', 's', 'replay', 1)`)
		return err
	}})
	var audits int
	if err2 := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pgoutbox.console_audit`).Scan(&audits); err != nil || err2 != nil ||
		audits != 1 || b.state(t, ids[0]) != "available" {
		t.Fatalf("err %v/%v, %d audit rows, state %s: want both committed", err, err2, audits, b.state(t, ids[0]))
	}
}
