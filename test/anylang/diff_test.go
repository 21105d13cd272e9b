package anylang

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// scriptedType is one effect type of the differential test: its replay
// safety, its max attempts and the outcome of each attempt (the last one
// repeats).
type scriptedType struct {
	ReplaySafe  bool     `json:"replaySafe"`
	MaxAttempts int      `json:"-"`
	Outcomes    []string `json:"outcomes"`
}

// diffScript covers every outcome, on replay-safe types and not, and max
// attempts running out.
var diffScript = map[string]scriptedType{
	"ok":                  {ReplaySafe: true, Outcomes: []string{"success"}},
	"ok.unsafe":           {Outcomes: []string{"success"}},
	"retry.then.ok":       {ReplaySafe: true, Outcomes: []string{"retry", "success"}},
	"retry.unsafe":        {Outcomes: []string{"retry", "success"}},
	"retry_after.then.ok": {ReplaySafe: true, Outcomes: []string{"retry_after", "success"}},
	"permanent":           {ReplaySafe: true, Outcomes: []string{"permanent"}},
	"permanent.unsafe":    {Outcomes: []string{"permanent"}},
	"ambiguous.safe":      {ReplaySafe: true, Outcomes: []string{"ambiguous", "success"}},
	"ambiguous.unsafe":    {Outcomes: []string{"ambiguous"}},
	"error.safe":          {ReplaySafe: true, Outcomes: []string{"error", "success"}},
	"error.unsafe":        {Outcomes: []string{"error"}},
	"exhausted":           {ReplaySafe: true, MaxAttempts: 2, Outcomes: []string{"retry"}},
	"exhausted.after":     {ReplaySafe: true, MaxAttempts: 2, Outcomes: []string{"retry_after"}},
}

// goOutcome is a script's outcome as a Go handler's error.
func goOutcome(o string) error {
	boom := errors.New("boom")
	switch o {
	case "success":
		return nil
	case "retry":
		return pgoutbox.Retry(boom)
	case "retry_after":
		return pgoutbox.RetryAfter(time.Second, boom)
	case "permanent":
		return pgoutbox.Permanent(boom)
	case "ambiguous":
		return pgoutbox.Ambiguous(boom)
	}
	return boom
}

// retryAfterText is the one part of an error's text each language spells
// its own way (Go's "1s", TypeScript's "1000ms").
var retryAfterText = regexp.MustCompile(` \(retry after [^)]*\)`)

// settledRows is every effect of queue, by type: its state, attempts, last
// error, which timestamps are set, and each failed attempt
// (effect_attempts), times and lease tokens left out, or, for an effect of
// a batch queue delivered from its batch (no row), its state; nil while an
// effect is still available or leased.
func settledRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool, queue string) map[string]string {
	t.Helper()
	rows, err := pool.Query(ctx, `
		SELECT s.effect_type, s.state::text, CASE WHEN e.id IS NULL THEN format('%s from the batch', s.state) ELSE
			format('%s attempts=%s/%s error=%s started=%s completed=%s dead=%s reconcile=%s lease=%s owner=%s history=%s',
				e.state, e.attempts, e.max_attempts, coalesce(e.last_error, '-'),
				e.delivery_started_at IS NOT NULL, e.completed_at IS NOT NULL, e.dead_lettered_at IS NOT NULL,
				e.reconciliation_at IS NOT NULL, e.lease_token IS NOT NULL OR e.lease_expires_at IS NOT NULL,
				e.lease_owner IS NOT NULL,
				(SELECT coalesce(string_agg(format('%s:%s:%s', a.attempt, a.outcome, coalesce(a.error, '-')), ',' ORDER BY a.seq), '')
				 FROM pgoutbox.effect_attempts a WHERE a.effect_id = e.id)) END
		FROM pgoutbox.effect_states s LEFT JOIN pgoutbox.effects e ON e.id = s.id WHERE s.queue = $1`, queue)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var typ, state, digest string
	settled := true
	if _, err := pgx.ForEachRow(rows, []any{&typ, &state, &digest}, func() error {
		if state == "available" || state == "leased" {
			settled = false
		}
		out[typ] = retryAfterText.ReplaceAllString(digest, " (retry after …)")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !settled {
		return nil
	}
	return out
}

// The same scripted outcomes through the Go Client (durable leases), the
// TypeScript Worker and the Python example worker (psycopg) leave equal
// rows: state, attempts, last error (its retry-after spelling aside),
// which timestamps are set, and the history of failed attempts. On a batch
// queue, the Go Client's batch loop, the TypeScript Worker's pages
// (claim_batch, settle_page) and the Python worker's (claim_batch,
// settle_batch) leave equal rows too: the same effects delivered from the
// batch, the same exceptions moved to rows.
func TestWorkersLeaveEqualRows(t *testing.T) {
	node := tool(t, "node")
	py := python(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := buildTypeScript(t, ctx)
	pool, dsn := pgtest.NewPool(t)

	queues := []string{"diff-go", "diff-ts", "diff-py", "diff-go-batch", "diff-ts-batch", "diff-py-batch"}
	for _, q := range []string{"diff-go-batch", "diff-ts-batch", "diff-py-batch"} {
		if err := pgoutbox.SetStorage(ctx, pool, q, pgoutbox.StorageBatch); err != nil {
			t.Fatal(err)
		}
	}
	var effects []pgoutbox.Effect
	for _, q := range queues {
		for name, s := range diffScript {
			effects = append(effects, pgoutbox.Effect{Queue: q, Type: name, Key: name, MaxAttempts: s.MaxAttempts,
				Payload: map[string]string{"type": name}})
		}
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	script, err := json.Marshal(diffScript)
	if err != nil {
		t.Fatal(err)
	}

	// Go.
	var types []pgoutbox.EffectType
	for name, s := range diffScript {
		types = append(types, pgoutbox.EffectType{Name: name, ReplaySafe: s.ReplaySafe,
			Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				return goOutcome(s.Outcomes[min(d.Attempt, len(s.Outcomes))-1])
			}})
	}
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{
			"diff-go":       {Concurrency: 4, RowLockLease: pgoutbox.RowLockLeaseOff},
			"diff-go-batch": {Concurrency: 4, RowLockLease: pgoutbox.RowLockLeaseOff, Storage: pgoutbox.StorageBatch},
		},
		BackoffCap: time.Second,
		Types:      types,
		Logger:     slog.New(slog.DiscardHandler), // every failure here is scripted
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := client.Stop(stopCtx); err != nil {
			t.Error(err)
		}
	}()

	// TypeScript and Python, as processes.
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		queue, dir, name string
		args             []string
	}{
		{"diff-ts", dir, node, []string{"test/diff-worker.mjs"}},
		{"diff-ts-batch", dir, node, []string{"test/diff-worker.mjs"}},
		{"diff-py-batch", here, py, []string{"diff_worker.py"}},
		{"diff-py", here, py, []string{"diff_worker.py"}},
	} {
		cmd := exec.CommandContext(ctx, p.name, p.args...)
		cmd.Dir = p.dir
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn, "QUEUE="+p.queue, "SCRIPT="+string(script))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Errorf("%s %v: %v", p.name, p.args, err)
			}
		}()
	}

	got := map[string]map[string]string{}
	pgtest.WaitFor(t, ctx, "every effect of the three queues to settle", func() bool {
		for _, q := range queues {
			if got[q] == nil {
				got[q] = settledRows(t, ctx, pool, q)
			}
			if got[q] == nil {
				return false
			}
		}
		return true
	})
	names := make([]string, 0, len(diffScript))
	for name := range diffScript {
		names = append(names, name)
	}
	sort.Strings(names)
	var report strings.Builder
	for _, storage := range []string{"", "-batch"} {
		fmt.Fprintf(&report, "storage %s:\n", map[string]string{"": "rows", "-batch": "batch"}[storage])
		for _, name := range names {
			g := got["diff-go"+storage][name]
			fmt.Fprintf(&report, "%s: %s\n", name, g)
			for _, lang := range []string{"ts", "py"} {
				if other := got["diff-"+lang+storage][name]; other != g {
					t.Errorf("%s through %s%s:\n  %s\nthrough Go:\n  %s", name, lang, storage, other, g)
				}
			}
		}
	}
	t.Logf("rows (equal through Go, TypeScript and Python):\n%s", report.String())
}
