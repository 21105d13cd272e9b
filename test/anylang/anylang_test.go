// Package anylang holds the cross-language tests of the SQL API (issue 19,
// docs/any-language.md): TypeScript (clients/typescript, node's test runner)
// and Python (psycopg) enqueue inside their own transactions against a fresh
// database, and a Go worker delivers exactly what they committed; a Node
// service verifies HTTP deliveries with the Standard Webhooks reference
// library (webhook-receiver/), and keeps the reconciliation rule when the
// `pgoutbox work` delivering to it is killed mid-request.
//
// The tests need node, npm and python3 with psycopg; without them they fail
// (make test-deps installs them on Debian). They build the TypeScript package
// first: npm ci when its node_modules is missing or older than its
// package-lock.json, then tsc.
package anylang

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m, func() error { return goleak.Find() }) }

const installHint = "install Node.js, npm and psycopg 3 (Debian: apt-get install nodejs npm python3-psycopg; make test-deps does it)"

// tool returns the path of a command or fails the test.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: %v; %s", name, err, installHint)
	}
	return p
}

// python returns a python3 that imports psycopg: the one on PATH, else
// Debian's (python3-psycopg installs into /usr/bin/python3's path, which a
// pyenv or venv python3 earlier on PATH does not see).
func python(t *testing.T) string {
	t.Helper()
	var tried []string
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			continue
		}
		if err := exec.Command(path, "-c", "import psycopg").Run(); err == nil {
			return path
		}
		tried = append(tried, path)
	}
	t.Fatalf("no python3 with psycopg (tried %v); %s", tried, installHint)
	return ""
}

// run runs a command in dir with extra environment and returns its
// combined output, failing the test (with the output) when it fails.
func run(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out.String())
	}
	return out.String()
}

// buildTypeScript installs the package's dev dependencies when needed and
// compiles it, and returns the package directory.
func buildTypeScript(t *testing.T, ctx context.Context) string {
	t.Helper()
	dir, err := filepath.Abs("../../clients/typescript")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, ctx, dir)
	run(t, ctx, dir, nil, tool(t, "npm"), "run", "--silent", "build")
	return dir
}

// delivered is one delivery the Go worker saw.
type delivered struct {
	Key     string
	Payload string
}

// TestAnyLanguageEnqueuesInItsOwnTransaction: TypeScript and Python enqueue
// in transactions that also write a domain row; what they roll back leaves
// nothing, what they commit a Go worker delivers, exactly once each; a key
// enqueued from Go and from TypeScript is one effect; bad input is refused
// with the SQL API's SQLSTATEs and writes nothing (the node tests and the
// Python check assert those themselves, and fail this test when they fail).
func TestAnyLanguageEnqueuesInItsOwnTransaction(t *testing.T) {
	node := tool(t, "node")
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	tsDir := buildTypeScript(t, ctx)

	pool, dsn := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE records (id text PRIMARY KEY, title text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	// Go writes the shared key first; TypeScript then enqueues it too.
	shared := pgoutbox.Key("record.upsert", "shared", "v1")
	var sharedID int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		sharedID, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "anylang", Type: "record.upsert", Key: shared,
			Payload: map[string]string{"from": "go"}})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	env := []string{"DATABASE_URL=" + dsn}
	out := run(t, ctx, tsDir, env, node, "--test", "--test-reporter=tap", "test/enqueue.test.mjs")
	summary := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$`).FindAllStringSubmatch(out, -1) {
		summary[m[1]] = m[2]
	}
	if summary["tests"] == "" || summary["tests"] == "0" || summary["pass"] != summary["tests"] {
		t.Fatalf("node --test: not every test passed (%v):\n%s", summary, out)
	}
	t.Logf("TypeScript: %s node tests passed", summary["pass"])
	out = run(t, ctx, "", env, py, "enqueue_check.py")
	t.Logf("Python: %d checks passed", strings.Count(out, "ok: "))

	// The same key from Go again: TypeScript's effect, nothing written.
	tsKey := pgoutbox.Key("record.upsert", "ts-1", "v1")
	var tsID, effects int64
	if err := pool.QueryRow(ctx, `SELECT effect_id FROM pgoutbox.effect_keys WHERE queue = 'anylang' AND idempotency_key = $1`, tsKey).Scan(&tsID); err != nil {
		t.Fatalf("TypeScript's committed effect: %v", err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "anylang", Type: "record.upsert", Key: tsKey, Payload: map[string]string{"from": "go"}})
		if err == nil && id != tsID {
			err = fmt.Errorf("Go's enqueue of TypeScript's key returned %d, want %d", id, tsID)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// What was committed, and only that: the records and their effects.
	want := map[string]string{
		pgoutbox.Key("record.upsert", "ts-1", "v1"): `{"id": "ts-1", "tags": ["a", "é"], "title": "From TypeScript"}`,
		pgoutbox.Key("record.upsert", "ts-2", "v1"): `{"id": "ts-2"}`,
		pgoutbox.Key("record.upsert", "ts-3", "v1"): `{"id": "ts-3"}`,
		shared: `{"from": "go"}`,
		pgoutbox.Key("record.upsert", "py-1", "v1"): `{"id": "py-1", "title": "From Python"}`,
		pgoutbox.Key("record.upsert", "py-2", "v1"): `{"id": "py-2"}`,
	}
	var records []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM records`).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(records, " "); got != "py-1 py-2 ts-1 ts-2 ts-3" {
		t.Fatalf("records %q, want the committed py-1 py-2 ts-1 ts-2 ts-3", got)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&effects); err != nil {
		t.Fatal(err)
	}
	if effects != int64(len(want)) {
		t.Fatalf("%d effects, want the %d committed", effects, len(want))
	}

	got := deliverAll(t, ctx, pool, len(want))
	if len(got) != len(want) {
		t.Fatalf("%d deliveries, want %d: %v", len(got), len(want), got)
	}
	for _, d := range got {
		w, ok := want[d.Key]
		if !ok {
			t.Errorf("delivered %s (%s), which no language committed", d.Key, d.Payload)
			continue
		}
		if d.Payload != w {
			t.Errorf("delivered %s with payload %s, want %s", d.Key, d.Payload, w)
		}
		delete(want, d.Key)
	}
	if len(want) > 0 {
		t.Errorf("never delivered: %v", want)
	}
	if sharedID == 0 {
		t.Fatal("no id for the shared key")
	}
}

// deliverAll runs a Go worker on the queue anylang until n effects are
// completed, and returns what its handler saw, in order.
func deliverAll(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int) []delivered {
	t.Helper()
	var mu sync.Mutex
	var got []delivered
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues:     map[string]pgoutbox.QueueConfig{"anylang": {Concurrency: 4}},
		BackoffCap: time.Millisecond,
		Types: []pgoutbox.EffectType{{
			Name:       "record.upsert",
			ReplaySafe: true,
			Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				var v any
				if err := json.Unmarshal(d.Payload, &v); err != nil {
					return pgoutbox.Permanent(err)
				}
				mu.Lock()
				got = append(got, delivered{Key: d.Key, Payload: string(d.Payload)})
				mu.Unlock()
				return nil
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	events, done := client.Subscribe(1024)
	defer done()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	completed := 0
	for completed < n {
		select {
		case e := <-events:
			if e.State == pgoutbox.StateCompleted {
				completed++
			} else if e.State != "" && e.State != pgoutbox.StateAvailable {
				t.Errorf("effect %d reached %s: %v", e.EffectID, e.State, e)
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d effects completed before the deadline", completed, n)
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d effects not completed (%v)", left, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return got
}
