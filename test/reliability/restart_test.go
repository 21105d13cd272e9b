package reliability

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// Scenario 2: restart PostgreSQL in immediate mode (a crash: no checkpoint,
// every backend killed, crash recovery at start) when half of a drain is
// done. The drain finishes with no manual step, nothing is lost, and no
// leased row with an expired lease is left; the recovery time is reported.
func TestPostgresImmediateRestartMidDrain(t *testing.T) {
	long(t)
	eachMode(t, testPostgresImmediateRestart)
}

func testPostgresImmediateRestart(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 8*time.Minute)
	cl := pgtest.NewCluster(t)
	d := clusterDB(t, cl)
	total := pick(10_000, 10_000)
	const lease = 3 * time.Second
	want := d.enqueue(t, ctx, spec{queue: "q", n: total, dispatchEvery: 10, keyPrefix: "k"})
	dir := t.TempDir()
	var workers []*worker
	for _, owner := range []string{"w1", "w2"} {
		workers = append(workers, startWorker(t, ctx, workerSpec{
			DSN: d.dsn, Owner: owner, Queue: "q", Concurrency: 8,
			Lease: lease, Sweep: 250 * time.Millisecond, Poll: 200 * time.Millisecond, Timeout: 2 * time.Second,
			BackoffCap: 500 * time.Millisecond, Latency: 2 * time.Millisecond, RowLock: hold,
			CallLog: filepath.Join(dir, owner+".calls"), LogFile: filepath.Join(dir, owner+".log"),
		}))
	}
	t0 := time.Now()
	waitFor(t, ctx, "half of the drain", 10*time.Millisecond, func() bool {
		return d.scalar(t, ctx, terminalSQL) >= int64(total/2)
	})
	crashAt := time.Now()
	rt, err := cl.Restart(ctx, pgtest.StopImmediate)
	if err != nil {
		t.Fatalf("restart: %v\n%s", err, tail(cl.LogFile(), 20))
	}
	upAt := time.Now()
	// The drain resumes by itself: the pools reconnect, the sweepers recover
	// the leases whose completions the crash cut off.
	var base int64
	waitFor(t, ctx, "a read after the restart", 10*time.Millisecond, func() bool {
		return d.pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`).Scan(&base) == nil
	})
	var stranded int64
	if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased'`).Scan(&stranded); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a completion after the restart", 10*time.Millisecond, func() bool {
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`) > base
	})
	firstCompletion := time.Now()
	waitFor(t, ctx, "the leases held at the crash recovered", 25*time.Millisecond, func() bool {
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND leased_at < $1`, crashAt) == 0
	})
	leasesRecovered := time.Now()
	waitFor(t, ctx, "every effect final", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, terminalSQL) == int64(total)
	})
	drain := time.Since(t0)
	if n := d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND lease_expires_at < now()`); n != 0 {
		t.Errorf("%d leased rows with an expired lease left", n)
	}
	for _, w := range workers {
		w.stop(t, ctx)
	}
	// One restart is one outage: each claim loop logs it once (and once
	// when claims resume), where it used to log every 5 ms retry.
	claimFailed := 0
	for _, w := range workers {
		b, err := os.ReadFile(w.spec.LogFile)
		if err != nil {
			t.Fatal(err)
		}
		claimFailed += strings.Count(string(b), `msg="claim failed`)
	}
	t.Logf("claim-failure log lines in both workers' logs: %d", claimFailed)
	// At most two per claim loop: a pool connection that died with the
	// server may fail one claim after the first success. A batch queue has
	// two claim loops per worker (its batches, and its exceptions' rows).
	loops := 1
	if testStorage() == pgoutbox.StorageBatch {
		loops = 2
	}
	if limit := 2 * loops * len(workers); claimFailed > limit {
		t.Errorf("%d claim-failure log lines for one restart, want at most %d", claimFailed, limit)
	}
	calls, torn := readCalls(t, dir)
	l := account(t, ctx, d, want, calls, torn)
	l.check(t)
	if l.States["dead_letter"] != 0 {
		t.Errorf("%d dead letters", l.States["dead_letter"])
	}
	f := l.figures()
	f["lease_s"] = lease.Seconds()
	f["server_stop_s"] = round(rt.Stop.Seconds())
	f["server_start_incl_crash_recovery_s"] = round(rt.Start.Seconds())
	f["crash_to_accepting_s"] = round(upAt.Sub(crashAt).Seconds())
	f["crash_to_first_completion_s"] = round(firstCompletion.Sub(crashAt).Seconds())
	f["crash_to_stranded_leases_recovered_s"] = round(leasesRecovered.Sub(crashAt).Seconds())
	f["leased_after_recovery"] = stranded
	f["drain_s"] = round(drain.Seconds())
	f["claim_failed_log_lines"] = claimFailed
	f["lease_mode"] = modeName(hold)
	report(t, "2 PostgreSQL immediate restart", f)
}
