package anylang

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// heldLine is what the holding Node endpoint prints per request.
type heldLine struct {
	ID       string `json:"id"`
	Verified bool   `json:"verified"`
	Held     bool   `json:"held"`
	Type     string `json:"type"`
	Attempt  string `json:"attempt"`
}

// TestWorkKilledMidHTTPDelivery is issue 31's reconciliation rule for HTTP
// delivery: the real `pgoutbox work` delivers over HTTP
// (PGOUTBOX_HTTP_DELIVERY) to a Node endpoint with no Go code, which
// verifies each request with the Standard Webhooks reference library and
// holds the first one of each webhook-id open; with both requests held,
// the work process is killed (SIGKILL), and a second `work` process
// recovers the leases once they expire. The non-replay-safe effect, whose
// delivery start was committed before its request left, goes to
// reconciliation_required and reached the endpoint exactly once; the
// replay-safe one is delivered again with the same webhook-id and
// completes. Once per lease mode of the replay-safe effect (a
// non-replay-safe one is always leased durably). It has a queue of its own,
// so that under a row lock it is still held by the lock when the process
// dies: in one claim batch with the other effect, that one would wait for
// the hold to end, and the receipt's lease would be durable by then.
func TestWorkKilledMidHTTPDelivery(t *testing.T) {
	node := tool(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // the build included
	defer cancel()
	dir, err := filepath.Abs("webhook-receiver")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, ctx, dir)
	bin := buildPgoutbox(t, ctx)
	for _, mode := range []struct{ name, rowLock string }{
		{"durable", "0"},  // replay-safe effects leased durably from the claim
		{"rowlock", "2s"}, // under the claim transaction's row lock for up to 2 s
	} {
		t.Run(mode.name, func(t *testing.T) {
			workKilledMidHTTPDelivery(t, ctx, node, dir, bin, mode.rowLock)
		})
	}
}

func workKilledMidHTTPDelivery(t *testing.T, ctx context.Context, node, dir, bin, rowLock string) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// The endpoint.
	receiver := exec.CommandContext(ctx, node, "holding-receiver.mjs")
	receiver.Dir = dir
	receiver.Env = append(receiver.Environ(), "WEBHOOK_SECRET="+secret)
	receiver.Stderr = os.Stderr
	stdout, err := receiver.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := receiver.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = receiver.Process.Kill(); _ = receiver.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening ") {
		t.Fatalf("the endpoint did not start: %q %v", sc.Text(), sc.Err())
	}
	url := "http://127.0.0.1:" + strings.TrimPrefix(sc.Text(), "listening ") + "/hooks"
	lines := make(chan heldLine, 16)
	go func() {
		defer close(lines)
		for sc.Scan() {
			var l heldLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()

	// The service's transaction: its order and the two effects, through
	// the SQL API.
	pool, dsn := pgtest.NewPool(t)
	var unsafe, safe int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, state text NOT NULL)`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES (4711, 'paid')`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pgoutbox.enqueue('payments', 'payment.capture', 'capture-4711', '{"order": 4711}'),
			pgoutbox.enqueue('emails', 'email.receipt', 'receipt-4711', '{"order": 4711}')`).Scan(&unsafe, &safe)
	}); err != nil {
		t.Fatal(err)
	}

	conf := filepath.Join(t.TempDir(), "http-delivery.json")
	if err := os.WriteFile(conf, []byte(`{"endpoints": {"shop": {"url": "`+url+`", "secret_env": "SHOP_HOOK_SECRET"}},
		"types": [{"queue": "payments", "type": "payment.capture", "endpoint": "shop"},
		          {"queue": "emails", "type": "email.receipt", "endpoint": "shop", "replay_safe": true}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "LANG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	env = append(env, "DATABASE_URL="+dsn, "PGOUTBOX_HTTP_DELIVERY="+conf, "SHOP_HOOK_SECRET="+secret,
		// A short lease (the delivery timeout is half of it, 3 s) and a
		// quick sweeper, so that a dead process's leases come back soon.
		"OUTBOX_LEASE_DURATION=6s", "OUTBOX_SWEEP_INTERVAL=100ms", "OUTBOX_POLL_INTERVAL=100ms",
		"OUTBOX_ROW_LOCK_LEASE="+rowLock)
	logs := t.TempDir()
	work := func(name string) (*exec.Cmd, string) {
		log := filepath.Join(logs, name+".log")
		f, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.CommandContext(ctx, bin, "work", "--metrics-addr", "")
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, log
	}
	tail := func(log string) string {
		b, _ := os.ReadFile(log)
		return string(b)
	}

	state := func(id int64) string { return pgtest.ReadEffect(t, ctx, pool, id).State }

	// The first work process sends both requests; the endpoint holds them.
	first, firstLog := work("first")
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	seen := map[string][]heldLine{}
	record := func(l heldLine) {
		seen[l.ID] = append(seen[l.ID], l)
		if !l.Verified {
			t.Errorf("a request the reference library refused: %+v", l)
		}
	}
	for len(seen["capture-4711"]) == 0 || len(seen["receipt-4711"]) == 0 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the endpoint exited")
			}
			record(l)
		case <-ctx.Done():
			t.Fatalf("the endpoint received %v before the deadline; work's output:\n%s", seen, tail(firstLog))
		}
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if e := pgtest.ReadEffect(t, ctx, pool, unsafe); e.State != "leased" {
		t.Fatalf("the non-replay-safe effect %d killed mid-request: %+v, want leased (the kill came after its delivery ended)", unsafe, e)
	} else if e.Started == nil {
		t.Errorf("the non-replay-safe effect %d killed mid-request: %+v, want delivery_started_at committed before its request left", unsafe, e)
	}
	// Under a row lock the killed claim wrote nothing: the lock went with
	// the process's connection and the receipt is available again.
	// Under a durable lease it stays leased until the lease expires.
	afterKill := "leased"
	if rowLock != "0" {
		afterKill = "available"
	}
	if s := state(safe); s != afterKill {
		t.Errorf("the replay-safe effect %d right after the kill: %s, want %s", safe, s, afterKill)
	}

	// A second work process recovers the dead one's leases.
	second, secondLog := work("second")
	t.Cleanup(func() { _ = second.Process.Kill(); _ = second.Wait() })
	settled := func(s string) bool { return s != "leased" && s != "available" }
	pgtest.WaitFor(t, ctx, "the killed process's effects to be recovered and settled", func() bool {
		return settled(state(unsafe)) && settled(state(safe))
	})
	if err := second.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := second.Wait(); err != nil {
		t.Errorf("the second work process's graceful stop: %v\n%s", err, tail(secondLog))
	}
	// Every request the endpoint received: it prints each on arrival and
	// exits on SIGTERM.
	if err := receiver.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		record(l)
	}

	if e := pgtest.ReadEffect(t, ctx, pool, unsafe); e.State != "reconciliation_required" || e.Started == nil {
		t.Errorf("the non-replay-safe effect %d killed mid-request: %+v, want reconciliation_required with delivery_started_at", unsafe, e)
	}
	if got := seen["capture-4711"]; len(got) != 1 {
		t.Errorf("the non-replay-safe effect reached the endpoint %d times, want once: %+v", len(got), got)
	}
	e := pgtest.ReadEffect(t, ctx, pool, safe)
	if e.State != "completed" {
		t.Errorf("the replay-safe effect %d killed mid-request: %+v, want completed (delivered again)", safe, e)
	}
	got := seen["receipt-4711"]
	if len(got) != 2 || !got[0].Held || got[1].Held {
		t.Errorf("the replay-safe effect's requests (webhook-id receipt-4711): %+v, want two: the held one, then one answered", got)
	}
	if rowLock == "0" && (e.Attempts != 2 || len(got) == 2 && (got[0].Attempt != "1" || got[1].Attempt != "2")) {
		t.Errorf("durable leases: the replay-safe effect's attempts %d, requests %+v; want 2, the second request attempt 2", e.Attempts, got)
	}
	t.Logf("requests: %+v", seen)
	if t.Failed() {
		t.Logf("first work process:\n%s\nsecond work process:\n%s", tail(firstLog), tail(secondLog))
	}
}

// buildPgoutbox builds cmd/pgoutbox, the binary an operator runs, into a
// temporary directory and returns its path.
func buildPgoutbox(t *testing.T, ctx context.Context) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pgoutbox")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/pgoutbox")
	cmd.Dir = filepath.Join("..", "..") // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgoutbox: %v\n%s", err, out)
	}
	return bin
}
