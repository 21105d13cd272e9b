package reliability

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// sample is one point of the xmin scenario's time series.
type sample struct {
	At          float64  `json:"t_s"`
	Phase       string   `json:"phase"`
	DeadTuples  int64    `json:"n_dead_tup"`
	Claims      int64    `json:"claims_in_window"`
	ClaimP99ms  *float64 `json:"claim_p99_ms"`
	XminAgeS    float64  `json:"xmin_age_s"`
	XminFiring  bool     `json:"xmin_alert_firing"`
	OldestAvail float64  `json:"oldest_available_age_s"`
}

var vacuumRE = regexp.MustCompile(`tuples: (\d+) removed, (\d+) remain, (\d+) are dead but not yet removable`)

// churnTable is the table a drain updates, whose dead tuples a held
// snapshot keeps: the effect rows in the row storage; in batch storage,
// where the stream is append-only and a success writes no row, the
// batches (each page's settle and each lease extension update one).
func churnTable() string {
	if testStorage() == pgoutbox.StorageBatch {
		return "pgoutbox.stream_batches"
	}
	return "pgoutbox.effects"
}

// vacuum runs VACUUM (VERBOSE) on table and returns the tuples it removed
// and those dead but not yet removable.
func vacuum(t *testing.T, ctx context.Context, dsn, table string) (removed, notRemovable int64) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var notices []string
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `VACUUM (VERBOSE) `+table); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range notices {
		if m := vacuumRE.FindStringSubmatch(n); m != nil {
			removed, _ = strconv.ParseInt(m[1], 10, 64)
			notRemovable, _ = strconv.ParseInt(m[3], 10, 64)
			return removed, notRemovable
		}
	}
	t.Fatalf("no tuple counts in VACUUM VERBOSE output: %q", notices)
	return 0, 0
}

// Scenario 7: a REPEATABLE READ transaction held open under load (scaled
// from the 5 minutes to 60 s; PGOUTBOX_RELIABILITY_FULL=1 holds it 5
// minutes). Claims keep working, the xmin-age alert rule (internal/ops,
// what `alert check` evaluates) fires while it is held and not after, and
// VACUUM removes the dead tuples once it ends. Claim p99 and dead tuples
// over time are reported.
func TestLongTransactionUnderLoad(t *testing.T) {
	long(t)
	hold := pick(60*time.Second, 5*time.Minute)
	const (
		warm    = 10 * time.Second
		cool    = 15 * time.Second
		window  = 5 * time.Second
		perTick = 10 // effects enqueued every 100 ms: 100/s
	)
	ctx := timeout(t, hold+5*time.Minute)
	bin := buildBinary(t, t.TempDir())
	cl := pgtest.NewCluster(t)
	d := clusterDB(t, cl)
	dir := t.TempDir()
	var workers []*worker
	for _, owner := range []string{"w1", "w2"} {
		workers = append(workers, startWorker(t, ctx, workerSpec{
			DSN: d.dsn, Owner: owner, Queue: "q", Concurrency: 8, Lease: 10 * time.Second,
			Sweep: time.Second, Poll: 200 * time.Millisecond, Timeout: 5 * time.Second, Latency: 2 * time.Millisecond,
			CallLog: filepath.Join(dir, owner+".calls"), LogFile: filepath.Join(dir, owner+".log"),
		}))
	}
	thresholds := ops.DefaultThresholds()
	thresholds.XminMaxAge = hold / 2

	// The load: 100 effects/s until the end.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var load sync.WaitGroup
	var produced, seq int
	var loadErr error
	load.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			batch := make([]pgoutbox.Effect, perTick)
			for i := range batch {
				seq++
				batch[i] = pgoutbox.Effect{Queue: "q", Type: typeSafe, Key: strconv.Itoa(seq)}
			}
			err := pgx.BeginFunc(loadCtx, d.pool, func(tx pgx.Tx) error {
				_, err := pgoutbox.EnqueueBatch(loadCtx, tx, batch)
				return err
			})
			if err != nil {
				if loadCtx.Err() == nil {
					loadErr = err
				}
				return
			}
			produced += perTick
		}
	})

	t0 := time.Now()
	var samples []sample
	take := func(phase string) sample {
		var s sample
		s.At, s.Phase = round(time.Since(t0).Seconds()), phase
		err := d.pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`, churnTable()).
			Scan(&s.DeadTuples)
		if err != nil {
			t.Fatal(err)
		}
		if testStorage() == pgoutbox.StorageBatch {
			// A batch's effects are claimed with it, not row by row:
			// the window's claims are its target calls (the call logs),
			// with no per-effect claim latency.
			calls, _ := readCalls(t, dir)
			for _, c := range calls {
				if time.Since(c.at) < window {
					s.Claims++
				}
			}
		} else {
			err = d.pool.QueryRow(ctx, `
				SELECT count(*),
				       (percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM leased_at - available_at)) * 1000)::float8
				FROM pgoutbox.effects WHERE leased_at > now() - make_interval(secs => $1)`, window.Seconds()).
				Scan(&s.Claims, &s.ClaimP99ms)
			if err != nil {
				t.Fatal(err)
			}
		}
		if s.ClaimP99ms != nil {
			v := round(*s.ClaimP99ms)
			s.ClaimP99ms = &v
		}
		snap, err := ops.Status(ctx, d.pool, ops.StatusOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rep := ops.Evaluate(snap, thresholds)
		for _, r := range rep.Rules {
			if r.Rule == ops.RuleXminAge {
				s.XminAgeS, s.XminFiring = round(r.Value), r.Firing
			}
		}
		s.OldestAvail = round(snap.Total().OldestAvailableAgeSeconds)
		samples = append(samples, s)
		return s
	}
	every := func(phase string, d time.Duration) {
		end := time.Now().Add(d)
		tick := time.NewTicker(window)
		defer tick.Stop()
		for time.Now().Before(end) {
			select {
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal("deadline")
			}
			take(phase)
		}
	}

	every("before", warm)
	// The long transaction: a snapshot taken now and kept.
	holder, err := pgx.Connect(ctx, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var seen int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	heldFrom := time.Now()
	every("held", hold-window)
	_, blockedByHolder := vacuum(t, ctx, d.dsn, churnTable())
	binFiring, binCode := alertCheck(t, bin, d.dsn, thresholds.XminMaxAge)
	if !binFiring || binCode != 3 {
		t.Errorf("pgoutbox alert check during the hold: %s firing %v, exit %d; want firing and exit 3", ops.RuleXminAge, binFiring, binCode)
	}
	every("held", time.Until(heldFrom.Add(hold)))
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	heldFor := time.Since(heldFrom)
	removedAfter, notRemovableAfter := vacuum(t, ctx, d.dsn, churnTable())
	if firing, _ := alertCheck(t, bin, d.dsn, thresholds.XminMaxAge); firing {
		t.Errorf("pgoutbox alert check after the hold: %s still firing", ops.RuleXminAge)
	}
	every("after", cool)
	stopLoad()
	load.Wait()
	if loadErr != nil {
		t.Fatalf("load: %v", loadErr)
	}
	waitFor(t, ctx, "the backlog drained", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state <> 'completed'`) == 0
	})
	d.checkStorage(t, ctx)
	for _, w := range workers {
		w.stop(t, ctx)
	}

	var heldP99, otherP99 []float64
	firedWhileHeld, firedAfter := false, false
	var maxDead int64
	for _, s := range samples {
		switch s.Phase {
		case "held":
			if s.Claims == 0 {
				t.Errorf("no claim in the %s window ending at %.0f s while the transaction was held", window, s.At)
			}
			firedWhileHeld = firedWhileHeld || s.XminFiring
			if s.ClaimP99ms != nil {
				heldP99 = append(heldP99, *s.ClaimP99ms)
			}
			maxDead = max(maxDead, s.DeadTuples)
		default:
			if s.ClaimP99ms != nil {
				otherP99 = append(otherP99, *s.ClaimP99ms)
			}
		}
		if s.Phase == "after" {
			firedAfter = firedAfter || s.XminFiring
		}
	}
	if !firedWhileHeld {
		t.Errorf("the %s rule never fired while a transaction was held for %s (threshold %s)", ops.RuleXminAge, heldFor, thresholds.XminMaxAge)
	}
	if firedAfter {
		t.Errorf("the %s rule still fired after the transaction ended", ops.RuleXminAge)
	}
	if blockedByHolder == 0 {
		t.Errorf("VACUUM during the hold found no dead-but-not-removable tuple; the held snapshot had no effect")
	}
	// Once the snapshot is gone, VACUUM (ours, or autovacuum before it) can
	// remove what the hold kept: almost nothing stays dead-but-not-removable
	// and the dead tuples fall well below their peak.
	if notRemovableAfter*10 > blockedByHolder {
		t.Errorf("VACUUM after the hold still found %d dead tuples it could not remove (%d during the hold)", notRemovableAfter, blockedByHolder)
	}
	for _, s := range samples {
		if s.Phase == "after" {
			if s.DeadTuples*2 > maxDead {
				t.Errorf("%d dead tuples %.0f s after the hold ended, more than half the peak of %d", s.DeadTuples, s.At, maxDead)
			}
			break
		}
	}
	maxOf := func(xs []float64) float64 {
		m := 0.0
		for _, x := range xs {
			m = max(m, x)
		}
		return round(m)
	}
	report(t, "7 REPEATABLE READ transaction held open", figures{
		"hold_s":                                round(heldFor.Seconds()),
		"rows_seen_by_holder":                   seen,
		"load_per_s":                            perTick * 10,
		"produced":                              produced,
		"xmin_alert_threshold_s":                thresholds.XminMaxAge.Seconds(),
		"xmin_alert_fired_while_held":           firedWhileHeld,
		"xmin_alert_fired_after":                firedAfter,
		"binary_alert_check_exit_while_held":    binCode,
		"vacuum_during_hold_dead_not_removable": blockedByHolder,
		"vacuum_after_hold_removed":             removedAfter,
		"vacuum_after_hold_dead_not_removable":  notRemovableAfter,
		"max_n_dead_tup_while_held":             maxDead,
		"claim_p99_ms_max_while_held":           maxOf(heldP99),
		"claim_p99_ms_max_otherwise":            maxOf(otherP99),
		"samples":                               samples,
	})
}

// alertCheck runs `pgoutbox alert check --json --fail-on-alert` with the
// xmin-age threshold and reports whether that rule fired, and the exit code.
func alertCheck(t *testing.T, bin, dsn string, xmin time.Duration) (bool, int) {
	t.Helper()
	stdout, stderr, code := cli(t, bin, baseEnv(map[string]string{"DATABASE_URL": dsn}),
		"alert", "check", "--json", "--fail-on-alert", "--xmin-max-age", xmin.String())
	var rep ops.AlertReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("alert check --json: %v\nstdout %s\nstderr %s", err, stdout, stderr)
	}
	for _, r := range rep.Rules {
		if r.Rule == ops.RuleXminAge {
			return r.Firing, code
		}
	}
	t.Fatalf("alert check --json has no %s rule: %s", ops.RuleXminAge, stdout)
	return false, code
}
