package anylang

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// nodeTests runs node's test runner on files of the TypeScript package
// against the database at dsn and fails unless every test passed.
func nodeTests(t *testing.T, ctx context.Context, dir, dsn string, files ...string) {
	t.Helper()
	args := append([]string{"--test", "--test-reporter=tap"}, files...)
	out := run(t, ctx, dir, []string{"DATABASE_URL=" + dsn}, tool(t, "node"), args...)
	summary := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$`).FindAllStringSubmatch(out, -1) {
		summary[m[1]] = m[2]
	}
	if summary["tests"] == "" || summary["tests"] == "0" || summary["pass"] != summary["tests"] {
		t.Fatalf("node --test %v: not every test passed (%v):\n%s", files, summary, out)
	}
	t.Logf("TypeScript: %s node tests passed (%v)", summary["pass"], files)
}

// TestTypeScriptWorker runs the Worker's node tests (clients/typescript,
// test/worker.test.mjs) on a fresh database: delivery at a bounded
// concurrency, every outcome's route, lease extension, NOTIFY wake-ups,
// graceful stop, and a queue not granted.
func TestTypeScriptWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := buildTypeScript(t, ctx)
	_, dsn := pgtest.NewPool(t)
	nodeTests(t, ctx, dir, dsn, "test/worker.test.mjs")
}

// A Node worker killed (SIGKILL) mid-delivery: once its leases expire, a
// second Node worker (no Go process runs) recovers them. The
// non-replay-safe effect, marked started before its handler ran, goes to
// reconciliation_required and is never delivered again; the replay-safe
// one is delivered again and completes. In batch storage the replay-safe
// effect runs from its batch page (claim_batch, migration 00032): the
// second worker's claim finds the page's lease expired and moves the
// effect to the row storage with the attempt it may have had.
func TestTypeScriptWorkerKilled(t *testing.T) {
	node := tool(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := buildTypeScript(t, ctx)
	pool, dsn := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE kill_deliveries (effect_id bigint NOT NULL, mode text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, storage := range []pgoutbox.Storage{pgoutbox.StorageRows, pgoutbox.StorageBatch} {
		t.Run(string(storage), func(t *testing.T) {
			killedWorker(t, ctx, node, dir, pool, dsn, storage)
		})
	}
}

// killedWorker runs TestTypeScriptWorkerKilled on a queue of storage.
func killedWorker(t *testing.T, ctx context.Context, node, dir string, pool *pgxpool.Pool, dsn string,
	storage pgoutbox.Storage) {
	queue := "kill-" + string(storage)
	if err := pgoutbox.SetStorage(ctx, pool, queue, storage); err != nil {
		t.Fatal(err)
	}
	var unsafe, safe int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: queue, Type: "charge.create", Key: "c1"},
			{Queue: queue, Type: "record.upsert", Key: "r1"},
		})
		if err == nil {
			unsafe, safe = ids[0], ids[1]
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	start := func(mode string) (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.CommandContext(ctx, node, "test/kill-worker.mjs")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn, "QUEUE="+queue, "MODE="+mode)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewScanner(out)
	}

	// The first worker starts both deliveries, and is killed.
	first, lines := start("hang")
	delivering := map[string]bool{}
	for len(delivering) < 2 && lines.Scan() {
		if id, ok := strings.CutPrefix(lines.Text(), "delivering "); ok {
			delivering[id] = true
		}
	}
	if len(delivering) < 2 {
		t.Fatalf("the first worker delivered %v, then stopped printing: %v", delivering, lines.Err())
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	var started bool
	if err := pool.QueryRow(ctx, `SELECT delivery_started_at IS NOT NULL FROM pgoutbox.effects WHERE id = $1 AND state = 'leased'`, unsafe).Scan(&started); err != nil || !started {
		t.Fatalf("the killed delivery of effect %d: started %t, %v; want leased and marked started", unsafe, started, err)
	}
	if n := pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1`, safe); storage == pgoutbox.StorageBatch && n != 0 {
		t.Fatalf("the replay-safe effect %d has a row while its page runs: want it delivered from the batch", safe)
	}

	// A second worker recovers the expired leases.
	second, _ := start("finish")
	defer func() {
		_ = second.Process.Signal(syscall.SIGTERM)
		_ = second.Wait()
	}()
	// pgoutbox.effect_states: in batch storage the replay-safe effect has
	// no row until the second worker takes its page over.
	state := func(id int64) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effect_states WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	settled := func(s string) bool { return s != "leased" && s != "available" }
	pgtest.WaitFor(t, ctx, "the killed worker's effects to be recovered and settled", func() bool {
		return settled(state(unsafe)) && settled(state(safe))
	})
	if s := state(unsafe); s != "reconciliation_required" {
		t.Errorf("the non-replay-safe effect %d killed mid-delivery is %s, want reconciliation_required", unsafe, s)
	}
	if s := state(safe); s != "completed" {
		t.Errorf("the replay-safe effect %d killed mid-delivery is %s, want completed (delivered again)", safe, s)
	}
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Fatalf("the second worker's graceful stop: %v", err)
	}
	count := func(id int64) int64 {
		return pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM kill_deliveries WHERE effect_id = $1`, id)
	}
	if n := count(unsafe); n != 1 {
		t.Errorf("the non-replay-safe effect %d was delivered %d times, want once", unsafe, n)
	}
	if n := count(safe); n != 2 {
		t.Errorf("the replay-safe effect %d was delivered %d times, want twice (killed, then again)", safe, n)
	}
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT attempts FROM pgoutbox.effects WHERE id = $1`, safe).Scan(&attempts); err != nil || attempts != 2 {
		t.Errorf("the replay-safe effect's attempts: %d, %v; want 2", attempts, err)
	}
	if storage == pgoutbox.StorageBatch {
		var first string
		if err := pool.QueryRow(ctx, `SELECT coalesce(error, '') FROM pgoutbox.effect_attempts WHERE effect_id = $1 AND attempt = 1`,
			safe).Scan(&first); err != nil || !strings.Contains(first, "batch lease expired") {
			t.Errorf("the replay-safe effect's first attempt: %q, %v; want the expired batch lease", first, err)
		}
	}
}

// The Node service of docs/any-language.md ("A TypeScript worker",
// clients/typescript/examples/worker-service.mjs, shown there verbatim)
// runs: it marks an order paid and enqueues its receipt in one
// transaction, delivers the receipt with its Worker, and stops gracefully
// on SIGTERM.
func TestTypeScriptWorkerServiceExample(t *testing.T) {
	node := tool(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := buildTypeScript(t, ctx)
	example, err := os.ReadFile(filepath.Join(dir, "examples", "worker-service.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/any-language.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```js\n"+string(example)+"```") {
		t.Fatal("docs/any-language.md does not show clients/typescript/examples/worker-service.mjs verbatim (in a js block)")
	}
	pool, dsn := pgtest.NewPool(t)
	cmd := exec.CommandContext(ctx, node, "examples/worker-service.mjs", "4711")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "sent the receipt of order 4711 ") {
		_ = cmd.Process.Kill()
		t.Fatalf("the service printed %q (%v), want the receipt sent", lines.Text(), lines.Err())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
		t.Logf("service: %s", lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the service's graceful stop: %v", err)
	}
	var state string
	var sent bool
	if err := pool.QueryRow(ctx, `SELECT o.state, o.receipt_sent_at IS NOT NULL FROM orders o WHERE o.id = 4711`).Scan(&state, &sent); err != nil || state != "paid" || !sent {
		t.Fatalf("order 4711: %q, receipt sent %t, %v", state, sent, err)
	}
	if n := pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'emails' AND state = 'completed' AND attempts = 1`); n != 1 {
		t.Fatalf("%d completed receipt effects, want 1", n)
	}
}

// The Python example worker wakes on NOTIFY: with a poll fallback of an
// hour, an effect enqueued once it listens is delivered.
func TestPythonWorkerWakesOnNotify(t *testing.T) {
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, dsn := pgtest.NewPool(t)
	cmd := exec.CommandContext(ctx, py, "worker_example.py")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn, "QUEUE=py-wake", "POLL_SECONDS=3600")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("the worker's graceful stop: %v", err)
		}
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "listening" {
		t.Fatalf("the worker printed %q (%v), want listening", lines.Text(), lines.Err())
	}
	var id int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "py-wake", Type: "record.upsert", Key: "r1",
			Payload: map[string]string{"id": "r1"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), fmt.Sprintf("effect %d (r1), attempt 1: ", id)) {
		t.Fatalf("the worker printed %q (%v), want effect %d delivered", lines.Text(), lines.Err(), id)
	}
	pgtest.WaitFor(t, ctx, "the effect to complete", func() bool {
		return pgtest.Scalar(t, ctx, pool, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'`, id) == 1
	})
}
