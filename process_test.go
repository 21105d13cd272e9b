package pgoutbox_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// The test binary doubles as a worker process: with childEnv set, TestMain
// runs childMain instead of the tests.
const (
	childEnv    = "PGOUTBOX_TEST_CHILD"
	childDSN    = "PGOUTBOX_TEST_CHILD_DSN"
	childLog    = "PGOUTBOX_TEST_CHILD_LOG"
	childConcur = "PGOUTBOX_TEST_CHILD_CONCURRENCY"
	childHold   = "PGOUTBOX_TEST_CHILD_ROW_LOCK" // QueueConfig.RowLockLease
)

// childMain is a worker process. Mode "drain" completes every effect of
// queue "bulk", appending "id token pid" per handler call to the call log, and
// stops gracefully when stdin closes. Mode "crash" prints "started <id>" for
// each delivery of queue "q" and then hangs until it is killed.
func childMain() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	concurrency, _ := strconv.Atoi(os.Getenv(childConcur))
	hold, _ := time.ParseDuration(os.Getenv(childHold))
	var cfg pgoutbox.Config
	switch os.Getenv(childEnv) {
	case "drain":
		log, err := os.OpenFile(os.Getenv(childLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer log.Close()
		pid := os.Getpid()
		cfg = pgoutbox.Config{
			Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: concurrency, RowLockLease: hold}},
			Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				token := d.LeaseToken
				if token == "" {
					token = "-" // a row-lock lease has no token
				}
				_, err := fmt.Fprintf(log, "%d %s %d\n", d.ID, token, pid)
				return err
			}}},
		}
	case "crash":
		hang := func(_ context.Context, d *pgoutbox.Delivery) error {
			fmt.Printf("started %d %s\n", d.ID, d.Type)
			select {} // until SIGKILL
		}
		cfg = pgoutbox.Config{
			Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: concurrency, RowLockLease: hold}},
			Types: []pgoutbox.EffectType{
				{Name: "safe", ReplaySafe: true, Handler: hang},
				{Name: "dispatch", Handler: hang},
			},
		}
	case "poison":
		// Effect "poison" kills its worker process (what a segfault or an
		// OOM kill does); every other effect appends "id attempt token" to
		// the call log and succeeds.
		log, err := os.OpenFile(os.Getenv(childLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer log.Close()
		cfg = pgoutbox.Config{
			Queues:        map[string]pgoutbox.QueueConfig{"q": {Concurrency: concurrency, RowLockLease: hold}},
			LeaseDuration: 4 * time.Second,
			SweepInterval: 100 * time.Millisecond,
			PollInterval:  50 * time.Millisecond,
			BackoffCap:    time.Millisecond,
			Types: []pgoutbox.EffectType{{Name: "safe", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				if d.Key == "poison" {
					fmt.Printf("poison %d attempt %d\n", d.ID, d.Attempt)
					_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
				token := d.LeaseToken
				if token == "" {
					token = "-"
				}
				_, err := fmt.Fprintf(log, "%d %d %s\n", d.ID, d.Attempt, token)
				return err
			}}},
		}
	default:
		return 2
	}
	cfg.Queues = withTestStorage(cfg.Queues) // the test matrix reaches the children too
	c, err := pgoutbox.NewClient(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // run until the parent closes stdin
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
}

func startChild(t *testing.T, mode, dsn, logPath string, concurrency int, hold time.Duration, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, childDSN+"="+dsn, childLog+"="+logPath,
		childConcur+"="+strconv.Itoa(concurrency), childHold+"="+hold.String())
	cmd.Env = append(cmd.Env, env...) // the last of a name wins
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &child{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(out)}
}

func TestExactlyOnceClaimingAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 effects; skipped with -short")
	}
	t.Parallel()
	t.Run("durable", func(t *testing.T) {
		t.Parallel()
		testExactlyOnce(t, setup(t), 100_000, pgoutbox.RowLockLeaseOff)
	})
	// Under row-lock leases no effect is claimed twice either: a locked
	// row is skipped by every other claimer until its batch commits.
	t.Run("rowlock", func(t *testing.T) {
		t.Parallel()
		testExactlyOnce(t, setup(t), 20_000, 50*time.Millisecond)
	})
	// Through PgBouncer in transaction mode (docs/poolers.md): the workers
	// claim, complete and hold their row-lock transactions through the
	// pooler, with no session for LISTEN (they poll).
	t.Run("pgbouncer durable", func(t *testing.T) {
		t.Parallel()
		testExactlyOnce(t, setupPooled(t).bundle, 10_000, pgoutbox.RowLockLeaseOff)
	})
	t.Run("pgbouncer rowlock", func(t *testing.T) {
		t.Parallel()
		testExactlyOnce(t, setupPooled(t).bundle, 5_000, 50*time.Millisecond)
	})
	// Batch storage, whatever the matrix: the queue's storage is recorded
	// before the enqueue, so every effect goes to the stream, and the
	// workers deliver it from batches.
	t.Run("batch", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		if err := pgoutbox.SetStorage(b.ctx, b.pool, "bulk", pgoutbox.StorageBatch); err != nil {
			t.Fatal(err)
		}
		testExactlyOnce(t, b, 20_000, pgoutbox.RowLockLeaseOff, storageEnv+"="+string(pgoutbox.StorageBatch))
		var n int64 // testExactlyOnce's context has ended
		if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM pgoutbox.stream`).Scan(&n); err != nil || n != 20_000 {
			t.Fatalf("%d effects went through the stream (%v), want 20000", n, err)
		}
	})
}

// testExactlyOnce drains total effects with two worker processes on b (its
// dsn is what the workers connect to; env is added to theirs).
func testExactlyOnce(t *testing.T, b *bundle, total int, hold time.Duration, env ...string) {
	// A safety net, not a timing assertion: the drain takes about a minute
	// on a 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	b.ctx = ctx
	for start := 0; start < total; start += 10_000 {
		end := min(start+10_000, total)
		batch := make([]pgoutbox.Effect, 0, end-start)
		for i := start; i < end; i++ {
			batch = append(batch, pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: strconv.Itoa(i),
				Payload: map[string]any{"n": i}})
		}
		b.enqueue(t, batch...)
	}
	dir := t.TempDir()
	var children []*child
	for i := range 2 { // 2 processes × 4 workers = 8 workers
		children = append(children, startChild(t, "drain", b.dsn, fmt.Sprintf("%s/calls-%d.log", dir, i), 4, hold, env...))
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`) < int64(total) {
		select {
		case <-tick.C:
		case <-b.ctx.Done():
			t.Fatal("drain did not finish")
		}
	}
	for _, c := range children {
		_ = c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("worker process: %v", err)
		}
	}
	calls := map[int64]int{}
	pids := map[string]bool{}
	lines := 0
	for i := range 2 {
		data, err := os.ReadFile(fmt.Sprintf("%s/calls-%d.log", dir, i))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue // a process that delivered nothing (a batch queue has one consumer at a time)
			}
			id, _ := strconv.ParseInt(f[0], 10, 64)
			calls[id]++
			pids[f[2]] = true
			lines++
		}
	}
	twice := 0
	for _, n := range calls {
		if n > 1 {
			twice++
		}
	}
	if lines != total || len(calls) != total || twice != 0 {
		t.Fatalf("call log: %d calls for %d distinct effects, %d delivered more than once; want %d, %d, 0", lines, len(calls), twice, total, total)
	}
	batch := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream`) > 0
	// A batch is one consumer's at a time (one lane): one process may
	// deliver every batch while the other waits for the next.
	if len(pids) != 2 && !batch {
		t.Fatalf("work done by %d processes, want 2", len(pids))
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`); batch && n != 0 {
		t.Fatalf("%d rows in pgoutbox.effects after a batch drain with no failure, want none", n)
	}
	var completed, attempts int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), coalesce(sum(attempts), 0)
		FROM pgoutbox.effect_states`).Scan(&completed, &attempts); err != nil {
		t.Fatal(err)
	}
	if completed != int64(total) || attempts != int64(total) {
		t.Fatalf("completed %d, attempts %d; want %d each (no effect claimed twice)", completed, attempts, total)
	}
}

func TestKilledWorkerProcess(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testKilledWorker(t, setup(t), mode.hold)
		})
		// The worker and its successor work through PgBouncer in
		// transaction mode (docs/poolers.md).
		t.Run("pgbouncer "+mode.name, func(t *testing.T) {
			t.Parallel()
			testKilledWorker(t, setupPooled(t).bundle, mode.hold)
		})
	}
	// Killed during the hold, before any lease was promoted: nothing was
	// written, so every effect is available with no attempt, but each
	// row keeps the dead claimer's lock in its xmax. The next claim sees
	// it and delivers those effects under durable leases, counting the
	// attempt (a poison that kills its worker is counted from its second
	// crash on: see TestPoisonThatKillsItsWorker).
	t.Run("rowlock-before-promotion", func(t *testing.T) {
		t.Parallel()
		testKilledDuringHold(t)
	})
}

func testKilledDuringHold(t *testing.T) {
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "dispatch"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "a"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "b"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "c"},
	)
	// A hold far longer than the test: the batch cannot close before the
	// kill, so the dispatch (which waits for the close) is never started.
	c := startChild(t, "crash", b.dsn, "", 4, 25*time.Second)
	started := map[string]int{}
	for len(started) < 3 {
		if !c.stdout.Scan() {
			t.Fatalf("worker exited early: %v", c.stdout.Err())
		}
		started[c.stdout.Text()]++
	}
	if n := b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle in transaction'`); n != 1 {
		t.Fatalf("%d claim transactions open before the kill, want 1 (the hold)", n)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	b.waitFor(t, "the dead worker's claim transaction ended", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`) == 0
	})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available' AND attempts = 0`); n != 4 {
		t.Fatalf("%d effects available with no attempt after the kill, want 4 (the row lock wrote nothing)", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE xmax <> '0'::xid`); n != 4 {
		t.Fatalf("%d rows carry the dead claimer's lock, want 4", n)
	}

	var mu sync.Mutex
	tokens := map[int64]string{}
	record := func(_ context.Context, d *pgoutbox.Delivery) error {
		mu.Lock()
		tokens[d.ID] = d.LeaseToken
		mu.Unlock()
		return nil
	}
	b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: 5 * time.Second}},
		Types: []pgoutbox.EffectType{
			{Name: "safe", ReplaySafe: true, Handler: record},
			{Name: "dispatch", Handler: record},
		},
	})
	// The effects were enqueued before the client started, so an event
	// subscription could miss the first completions: read the rows.
	b.waitFor(t, "every effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == int64(len(ids))
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids[1:] {
		if tokens[id] == "" {
			t.Errorf("effect %d, held by the killed worker, was delivered again under a row lock (no attempt counted), want a durable lease", id)
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND attempts = 1`); n != 4 {
		t.Fatalf("%d effects completed with attempt 1, want 4", n)
	}
}

// A poison effect that kills its worker process every time (SIGKILL from
// its own handler) is counted in both lease modes and dead-lettered after
// its MaxAttempts, while every other effect of the queue completes once.
// Under row-lock leases the first crash is not counted (the hold wrote
// nothing); the next claim sees the dead claimer's lock in the row, or
// (after a freeze) its claim record, and takes a durable lease, so it
// crashes at most MaxAttempts+1 times.
func TestPoisonThatKillsItsWorker(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name       string
		hold       time.Duration
		maxCrashes int
		freeze     bool
	}{
		{"durable", pgoutbox.RowLockLeaseOff, 3, false},
		{"rowlock", time.Second, 4, false},
		// VACUUM (FREEZE) after every crash (what autovacuum does with
		// vacuum_freeze_min_age = 0, and PostgreSQL 16+ opportunistically):
		// durable leases count the attempt in the row, which no vacuum
		// erases; row-lock leases count a crash through the dead claimer's
		// lock in xmax, which the freeze clears, and through the claim's
		// record in pgoutbox.lock_claims, which it does not.
		{"durable freeze", pgoutbox.RowLockLeaseOff, 3, true},
		{"rowlock freeze", time.Second, 4, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			testPoisonKillsWorker(t, mode.hold, mode.maxCrashes, mode.freeze)
		})
	}
}

func testPoisonKillsWorker(t *testing.T, hold time.Duration, maxCrashes int, freeze bool) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b.ctx = ctx
	const maxAttempts, others = 3, 20
	effects := []pgoutbox.Effect{{Queue: "q", Type: "safe", Key: "poison", MaxAttempts: maxAttempts}}
	for i := range others {
		effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "safe", Key: fmt.Sprint("ok-", i), MaxAttempts: maxAttempts})
	}
	ids := b.enqueue(t, effects...) // the poison first: the head of the claim order
	logPath := t.TempDir() + "/calls.log"
	done := func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter' AND id = $1`, ids[0]) == 1 &&
			b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == others
	}
	crashes := 0
	for !done() {
		if crashes > maxCrashes {
			t.Fatalf("the poison crashed its worker %d times and the queue is not drained: %+v", crashes, b.row(t, ids[0]))
		}
		// One worker at a time, one delivery at a time: each crash is the
		// poison's alone.
		c := startChild(t, "poison", b.dsn, logPath, 1, hold)
		exited := make(chan error, 1)
		go func() { exited <- c.cmd.Wait() }()
		tick := time.NewTicker(20 * time.Millisecond)
	wait:
		for {
			select {
			case err := <-exited:
				if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
					t.Fatalf("worker exited with %v, want killed by its poison", err)
				}
				crashes++
				if freeze {
					b.freezeAfterCrash(t, ids[0])
				}
				break wait
			case <-tick.C:
				if done() {
					_ = c.stdin.Close()
					if err := <-exited; err != nil {
						t.Fatalf("worker: %v", err)
					}
					break wait
				}
			case <-ctx.Done():
				t.Fatalf("after %d crashes the queue did not drain: poison %+v", crashes, b.row(t, ids[0]))
			}
		}
		tick.Stop()
	}
	if r := b.row(t, ids[0]); r.State != "dead_letter" || r.Attempts != maxAttempts {
		t.Fatalf("poison: %+v, want dead_letter after %d attempts", r, maxAttempts)
	}
	if crashes > maxCrashes {
		t.Fatalf("%d crashes, want at most %d", crashes, maxCrashes)
	}
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		calls[strings.Fields(line)[0]]++
	}
	for _, id := range ids[1:] {
		if calls[fmt.Sprint(id)] != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, calls[fmt.Sprint(id)])
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND attempts = 1`); n != others {
		t.Errorf("%d other effects completed with one attempt, want %d", n, others)
	}
	t.Logf("poison dead-lettered after %d worker crashes", crashes)
}

// freezeAfterCrash waits until the killed worker's claim transaction has
// ended, then freezes the effects table until the poison's row (id) carries
// no lock any more.
func (b *bundle) freezeAfterCrash(t *testing.T, id int64) {
	t.Helper()
	b.waitFor(t, "the dead worker's claim transaction ended", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`) == 0
	})
	b.waitFor(t, "VACUUM (FREEZE) erased the dead claimer's lock from the poison's row", func() bool {
		if _, err := b.pool.Exec(b.ctx, `VACUUM (FREEZE) pgoutbox.effects`); err != nil {
			t.Fatal(err)
		}
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND xmax <> '0'::xid`, id) == 0
	})
}

func testKilledWorker(t *testing.T, b *bundle, hold time.Duration) {
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "dispatch"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "a"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "b"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "c"},
	)
	c := startChild(t, "crash", b.dsn, "", 4, hold)
	started := map[string]int{}
	for len(started) < 4 {
		if !c.stdout.Scan() {
			t.Fatalf("worker exited early: %v", c.stdout.Err())
		}
		started[c.stdout.Text()]++
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased'`); n != 4 {
		t.Fatalf("%d leased after the kill, want 4", n)
	}
	expire(t, b, ids...) // the dead worker's leases run out

	var dispatches, safe atomic.Int64
	client := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types: []pgoutbox.EffectType{
			{Name: "safe", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error { safe.Add(1); return nil }},
			{Name: "dispatch", Handler: func(context.Context, *pgoutbox.Delivery) error { dispatches.Add(1); return nil }},
		},
	})
	events := watch(t, client)
	if _, err := client.Sweep(b.ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[1:] {
		b.waitEvent(t, events, id, "completed")
	}
	if r := b.row(t, ids[0]); r.State != "reconciliation_required" || r.Started == nil {
		t.Fatalf("dispatch: %+v, want reconciliation_required with delivery_started_at", r)
	}
	if dispatches.Load() != 0 || safe.Load() != 3 {
		t.Fatalf("after the crash: %d dispatches resent, %d replay-safe delivered; want 0 and 3", dispatches.Load(), safe.Load())
	}
	if started[fmt.Sprintf("started %d dispatch", ids[0])] != 1 {
		t.Fatalf("the dispatch was sent %v times before the crash, want once", started)
	}
}
