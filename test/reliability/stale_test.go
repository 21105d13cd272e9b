package reliability

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// Scenario 6: a worker process is paused (SIGSTOP) while it holds leases,
// past their expiry; a sweeper recovers them and another worker completes
// the replay-safe ones; the dispatch goes to reconciliation_required. Then
// the stale worker resumes (SIGCONT) and finishes its calls: each of its
// writes (complete, fail) matches no row, and every row is byte-for-byte
// what it was before it resumed.
func TestStaleWorkerWritesChangeNothing(t *testing.T) {
	long(t)
	eachMode(t, testStaleWorker)
}

func testStaleWorker(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 3*time.Minute)
	d := newDB(t)
	const lease = 2 * time.Second
	var ids []int64
	d.useTestStorage(t, ctx, "q")
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		for _, e := range []pgoutbox.Effect{
			{Queue: "q", Type: typeSafe, Key: "ok-1"},       // the stale worker will try to complete it
			{Queue: "q", Type: typeSafe, Key: "fail-1"},     // ... to fail it
			{Queue: "q", Type: typeDispatch, Key: "ok-2"},   // ... to complete a started dispatch
			{Queue: "q", Type: typeDispatch, Key: "fail-2"}, // ... to fail a started dispatch
		} {
			id, err := pgoutbox.Enqueue(ctx, tx, e)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	stale := startWorker(t, ctx, workerSpec{
		DSN: d.dsn, Owner: "stale", Queue: "q", Concurrency: 4, Lease: lease, Sweep: -1,
		Poll: 100 * time.Millisecond, Timeout: 1500 * time.Millisecond, Gate: true, Events: true, RowLock: hold,
		CallLog: filepath.Join(dir, "stale.calls"), LogFile: filepath.Join(dir, "stale.log"),
	})
	for range ids {
		stale.expect(t, ctx, "started ")
	}
	if err := stale.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	waitFor(t, ctx, "the stale worker's leases expired", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND lease_expires_at < now()`) == int64(len(ids))
	})
	// A live worker: its sweeper recovers the leases, it completes the
	// replay-safe effects; the dispatches go to reconciliation.
	live := startWorker(t, ctx, workerSpec{
		DSN: d.dsn, Owner: "live", Queue: "q", Concurrency: 4, Lease: lease, Sweep: 100 * time.Millisecond,
		Poll: 100 * time.Millisecond, Timeout: 1500 * time.Millisecond, BackoffCap: 100 * time.Millisecond, RowLock: hold,
		CallLog: filepath.Join(dir, "live.calls"), LogFile: filepath.Join(dir, "live.log"),
	})
	waitFor(t, ctx, "the live worker took over", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state IN ('completed', 'reconciliation_required')`) == int64(len(ids))
	})
	live.stop(t, ctx)
	d.checkStorage(t, ctx)
	before := snapshotRows(t, ctx, d)
	if err := stale.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	paused := time.Since(stoppedAt)
	if _, err := fmt.Fprintln(stale.stdin, "go"); err != nil {
		t.Fatal(err)
	}
	// Each of the stale worker's deliveries ends with a fenced write that
	// matches no row (whether the extender noticed first and cancelled it,
	// or the handler finished): one lease_lost outcome per effect.
	lost := map[string]bool{}
	for len(lost) < len(ids) {
		line := stale.expect(t, ctx, "event ")
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] != string(pgoutbox.OutcomeLeaseLost) {
			t.Errorf("stale worker recorded %q; want only lease_lost outcomes", line)
		}
		lost[f[1]] = true
	}
	stale.stop(t, ctx)
	after := snapshotRows(t, ctx, d)
	changed := 0
	for id, row := range before {
		if after[id] != row {
			changed++
			t.Errorf("%s changed after the stale worker resumed:\nbefore %s\nafter  %s", id, row, after[id])
		}
	}
	var states []string
	for _, id := range ids {
		var st string
		if err := d.pool.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effect_states WHERE id = $1`, id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		states = append(states, st)
	}
	if want := []string{"completed", "completed", "reconciliation_required", "reconciliation_required"}; strings.Join(states, ",") != strings.Join(want, ",") {
		t.Errorf("states %v, want %v", states, want)
	}
	report(t, "6 stale worker (SIGSTOP/SIGCONT)", figures{
		"effects": len(ids), "paused_s": round(paused.Seconds()), "lease_s": lease.Seconds(),
		"lease_mode": modeName(hold), "stale_writes_lease_lost": len(lost), "rows_changed_by_stale_worker": changed, "final_states": states,
	})
}

// snapshotRows returns every effect row, and every batch of batch
// storage (its settled position and lease), as JSON, by "effect <id>" and
// "batch <queue> <id>".
func snapshotRows(t *testing.T, ctx context.Context, d *db) map[string]string {
	t.Helper()
	rows, err := d.pool.Query(ctx, `SELECT 'effect ' || id, to_jsonb(e)::text FROM pgoutbox.effects e
		UNION ALL SELECT 'batch ' || queue || ' ' || id, to_jsonb(b)::text FROM pgoutbox.stream_batches b`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id string
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
