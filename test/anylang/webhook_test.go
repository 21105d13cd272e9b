package anylang

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// receiverLine is what the Node receiver prints per request.
type receiverLine struct {
	ID       string          `json:"id"`
	Verified bool            `json:"verified"`
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	Error    string          `json:"error"`
}

// TestNodeVerifiesHTTPDeliveries: a Node service verifies pgoutbox's HTTP
// deliveries with the Standard Webhooks reference library (npm
// standardwebhooks), an implementation independent of ours: what is signed
// with its secret verifies and completes, what is signed with another is
// refused by the library and dead-letters.
func TestNodeVerifiesHTTPDeliveries(t *testing.T) {
	node := tool(t, "node")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := filepath.Abs("webhook-receiver")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, ctx, dir)
	const secret, other = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	cmd := exec.CommandContext(ctx, node, "receiver.mjs")
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "WEBHOOK_SECRET="+secret)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "listening ") {
		t.Fatalf("receiver did not start: %q %v", sc.Text(), sc.Err())
	}
	url := "http://127.0.0.1:" + strings.TrimPrefix(sc.Text(), "listening ") + "/hooks"
	lines := make(chan receiverLine, 16)
	go func() {
		for sc.Scan() {
			var l receiverLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()

	pool, _ := pgtest.NewPool(t)
	right, err := httpdelivery.New(httpdelivery.Endpoint{Name: "node", URL: url, Secret: secret}, nil)
	if err != nil {
		t.Fatal(err)
	}
	wrong, err := httpdelivery.New(httpdelivery.Endpoint{Name: "node-wrong-secret", URL: url, Secret: other}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{SweepInterval: -1, PruneInterval: -1, Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]pgoutbox.QueueConfig{"hooks": {}},
		Types: []pgoutbox.EffectType{
			{Name: "hook.signed", ReplaySafe: true, Handler: right.Handler()},
			{Name: "hook.forged", ReplaySafe: true, Handler: wrong.Handler()},
		}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "hooks", Type: "hook.signed", Key: "signed-1", Payload: map[string]any{"order": 1, "name": "ünï 🙂"}},
			{Queue: "hooks", Type: "hook.forged", Key: "forged-1", Payload: map[string]any{"order": 2}},
		})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.WithoutCancel(ctx)) }()
	got := map[string]receiverLine{}
	for len(got) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the receiver exited")
			}
			got[l.ID] = l
		case <-ctx.Done():
			t.Fatalf("receiver lines: %v, want 2", got)
		}
	}
	if l := got["signed-1"]; !l.Verified || l.Type != "hook.signed" || !strings.Contains(string(l.Data), `"ünï 🙂"`) {
		t.Errorf("signed with the receiver's secret: %+v, want verified by standardwebhooks", l)
	}
	if l := got["forged-1"]; l.Verified {
		t.Errorf("signed with another secret: %+v, want refused by standardwebhooks", l)
	}
	state := func(id int64) string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	pgtest.WaitFor(t, ctx, "both settled", func() bool { return state(ids[0]) == "completed" && state(ids[1]) == "dead_letter" })
}

// npmCI installs dir's dependencies when its node_modules is missing or
// older than its package-lock.json.
func npmCI(t *testing.T, ctx context.Context, dir string) {
	t.Helper()
	npm := tool(t, "npm")
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil || installed.ModTime().Before(lock.ModTime()) {
		run(t, ctx, dir, nil, npm, "ci", "--no-audit", "--no-fund")
	}
}
