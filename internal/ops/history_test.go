package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// runClient runs a Client on queue "h" with handler until cond holds.
func (b *bundle) runClient(t *testing.T, handler pgoutbox.Handler, what string, cond func() bool) {
	t.Helper()
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Logger: slog.New(slog.DiscardHandler), BackoffCap: time.Millisecond, PollInterval: 20 * time.Millisecond,
		HeartbeatInterval: -1, SampleInterval: -1,
		Queues: map[string]pgoutbox.QueueConfig{"h": {}},
		Types:  []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: handler}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()
	pgtest.WaitFor(t, b.ctx, what, cond)
}

// `effect history ID` prints the effect's whole story, in order: enqueued,
// each failed attempt with its worker and its error redacted, the dead
// letter, the replay and the operator who did it (console_audit), the
// claim and the completion. An unknown id exits 1 and says so.
func TestCommandEffectHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	binary(t)
	var id int64
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		ids, err := pgoutbox.EnqueueBatch(b.ctx, tx, []pgoutbox.Effect{{Queue: "h", Type: "t", Key: "story", MaxAttempts: 2}})
		if len(ids) == 1 {
			id = ids[0]
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		var s string
		if err := b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	b.runClient(t, func(context.Context, *pgoutbox.Delivery) error {
		return pgoutbox.Retry(errors.New(`POST https://ci.example/hook?token=s3cr3t-value: HTTP 503`))
	}, "the effect dead-lettered", func() bool { return state() == "dead_letter" })
	if _, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{IDs: []int64{id},
		Then: func(ctx context.Context, tx pgx.Tx, res *ops.ReplayResult) error {
			return store.InsertAudit(ctx, tx, store.AuditEntry{Operator: "alice", Session: "s", Action: "replay",
				Target: fmt.Sprintf("ids %d,%d", id+1000, id), Changed: 1, Outcome: "replayed 1"})
		}}); err != nil {
		t.Fatal(err)
	}
	// Another effect's action is not this one's.
	if err := store.InsertAudit(b.ctx, b.pool, store.AuditEntry{Operator: "bob", Session: "s", Action: "supersede",
		Target: fmt.Sprintf("effect %d1", id), Changed: 1, Outcome: "superseded"}); err != nil {
		t.Fatal(err)
	}
	b.runClient(t, func(context.Context, *pgoutbox.Delivery) error { return nil },
		"the replayed effect completed", func() bool { return state() == "completed" })

	r := b.run(t, nil, "effect", "history", fmt.Sprint(id))
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if strings.Contains(r.stdout, "s3cr3t") || strings.Contains(r.stdout, "bob") {
		t.Fatalf("history shows a credential or another effect's action:\n%s", r.stdout)
	}
	want := []string{
		fmt.Sprintf(`^effect %d: queue h, type t, key story; completed after 1 of 2 attempts$`, id),
		`^AT +EVENT +BY +DETAIL$`,
		`^\S+ +enqueued +- +-$`,
		`^\S+ +attempt 1 failed → retrying +\S+ +POST https://ci.example/hook\?token=\[redacted\] HTTP 503 \(retry\)$`,
		`^\S+ +attempt 2 failed → dead_letter +\S+ +POST https://ci.example/hook\?token=\[redacted\] HTTP 503 \(retry\)$`,
		`^\S+ +replayed by an operator after 2 attempt\(s\): attempts start again +- +-$`,
		fmt.Sprintf(`^\S+ +replay by alice in the console \(ids %d,%d\) +alice +replayed 1$`, id+1000, id),
		`^\S+ +claimed \(attempt 1, the latest claim\) +\S+ +-$`,
		`^\S+ +completed +- +-$`,
	}
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), r.stdout)
	}
	for i, w := range want {
		if !regexp.MustCompile(w).MatchString(lines[i]) {
			t.Errorf("line %d %q does not match %s", i+1, lines[i], w)
		}
	}

	var h ops.History
	b.runJSON(t, nil, 0, &h, "effect", "history", fmt.Sprint(id))
	if h.ID != id || h.State != "completed" || len(h.Events) != len(want)-2 || h.Events[1].Kind != "attempt_failed" ||
		!strings.Contains(h.Events[1].Detail, "token=[redacted]") || h.Events[4].Operator != "alice" {
		out, _ := json.Marshal(h)
		t.Fatalf("--json: %s", out)
	}

	for _, arg := range []string{fmt.Sprint(id + 999999), "0", "x"} {
		r := b.run(t, nil, "effect", "history", arg)
		if r.code != 1 || (arg != "x" && arg != "0" && !strings.Contains(r.stderr, "no effect "+arg)) ||
			((arg == "x" || arg == "0") && !strings.Contains(r.stderr, "invalid effect id")) || r.stdout != "" {
			t.Errorf("history %s: exit %d, stdout %q, stderr %q; want exit 1 and a clear message", arg, r.code, r.stdout, r.stderr)
		}
	}
}
