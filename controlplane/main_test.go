package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

// secret is a canary: it must never appear in a table or a log line.
const secret = "whsec-canary-5f1c2a9e"

// corpusDir is GitHub's published webhook payloads (see fakegh.PayloadsDir).
func corpusDir(t testing.TB) string {
	t.Helper()
	dir, err := fakegh.PayloadsDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	app  *controlplane.App
	srv  *httptest.Server
	logs *bytes.Buffer
	seq  atomic.Int64
}

func setup(t *testing.T, gh controlplane.GitHub, cfg controlplane.Config) *bundle {
	t.Helper()
	b, mux := newBundle(t)
	b.mount(t, mux, gh, cfg)
	return b
}

// newBundle starts the database and the HTTP server; routes are mounted
// later, so an emulator can be pointed at the server first.
func newBundle(t *testing.T) (*bundle, *http.ServeMux) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	return newBundleOn(t, pool)
}

// newBundleOn is newBundle on a given pool.
func newBundleOn(t *testing.T, pool *pgxpool.Pool) (*bundle, *http.ServeMux) {
	t.Helper()
	ctx := pgtest.Context(t, 2*time.Minute)
	b := &bundle{ctx: ctx, pool: pool, logs: &bytes.Buffer{}}
	mux := http.NewServeMux()
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b, mux
}

func (b *bundle) mount(t *testing.T, mux *http.ServeMux, gh controlplane.GitHub, cfg controlplane.Config) {
	t.Helper()
	if cfg.WebhookSecret == nil {
		cfg.WebhookSecret = []byte(secret)
	}
	app, err := controlplane.New(b.pool, cfg, gh, newLogger(b.logs))
	if err != nil {
		t.Fatal(err)
	}
	b.app = app
	app.Routes(mux)
}

// post sends a webhook delivery, signed with the test secret unless the
// headers say otherwise.
func (b *bundle) post(t *testing.T, event, delivery string, body []byte, header map[string]string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL+"/webhooks/github", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", event)
	req.Header.Set("X-GitHub-Delivery", delivery)
	req.Header.Set("X-Hub-Signature-256", webhook.Sign([]byte(secret), body))
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// deliver posts an event with a fresh delivery id and expects 202.
func (b *bundle) deliver(t *testing.T, event string, payload any) {
	t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("delivery-%d", b.seq.Add(1))
	if code := b.post(t, event, id, body, nil); code != http.StatusAccepted {
		t.Fatalf("%s delivery: %d, want 202", event, code)
	}
}

func (b *bundle) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	return pgtest.Scalar(t, b.ctx, b.pool, sql, args...)
}

func (b *bundle) counts(t *testing.T) [2]int64 {
	return [2]int64{
		b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox`),
		b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`),
	}
}

// startWorkers runs the control plane's queues (or only some of them).
func (b *bundle) startWorkers(t *testing.T, queues ...string) *pgoutbox.Client {
	t.Helper()
	qs := b.app.Queues()
	if len(queues) > 0 {
		only := map[string]pgoutbox.QueueConfig{}
		for _, q := range queues {
			only[q] = qs[q]
		}
		qs = only
	}
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues: qs, Types: b.app.Types(), Logger: newLogger(b.logs),
		BackoffCap: 50 * time.Millisecond, PollInterval: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
	return c
}

// waitFor polls until cond holds or the test deadline passes.
func (b *bundle) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, b.ctx, what, cond)
}

// idle reports that no effect of queue is waiting or in flight.
func (b *bundle) idle(t *testing.T, queue string) bool {
	return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1 AND state IN ('available','leased')`, queue) == 0
}

func TestCorpusIsAcceptedAndNormalized(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	dir := corpusDir(t)
	events, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	posted := 0
	for _, ev := range events {
		if !ev.IsDir() {
			continue
		}
		files, _ := filepath.Glob(filepath.Join(dir, ev.Name(), "*.json"))
		for _, f := range files {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			id := ev.Name() + "/" + filepath.Base(f)
			if code := b.post(t, ev.Name(), id, body, nil); code != http.StatusAccepted {
				t.Fatalf("%s: %d, want 202", id, code)
			}
			if code := b.post(t, ev.Name(), id, body, nil); code != http.StatusOK {
				t.Fatalf("%s redelivered: %d, want 200", id, code)
			}
			posted++
		}
	}
	if posted < 200 {
		t.Fatalf("only %d payloads found", posted)
	}
	if c := b.counts(t); c[0] != int64(posted) || c[1] != int64(posted) {
		t.Fatalf("inbox %d, jobs %d; want %d each (redeliveries write nothing)", c[0], c[1], posted)
	}
	b.startWorkers(t, controlplane.QueueJobs)
	b.waitFor(t, "every job done", func() bool { return b.idle(t, controlplane.QueueJobs) })
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1 AND state <> 'completed'`, controlplane.QueueJobs); n != 0 {
		t.Fatalf("%d lifecycle jobs failed", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox WHERE status = 'received'`); n != 0 {
		t.Fatalf("%d inbox rows unprocessed", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox WHERE normalized::text LIKE '%' || $1 || '%'`, secret); n != 0 {
		t.Fatal("the webhook secret reached the inbox")
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{MaxBodyBytes: 4096})
	good := []byte(`{"zen":"Keep it logically awesome.","hook_id":1}`)
	cases := []struct {
		name   string
		body   []byte
		header map[string]string
		want   int
	}{
		{"bad signature", good, map[string]string{"X-Hub-Signature-256": "sha256=" + strings.Repeat("0", 64)}, 401},
		{"missing signature", good, map[string]string{"X-Hub-Signature-256": ""}, 401},
		{"sha1 only", good, map[string]string{"X-Hub-Signature-256": "", "X-Hub-Signature": "sha1=" + strings.Repeat("a", 40)}, 401},
		{"signature over other bytes", good, map[string]string{"X-Hub-Signature-256": webhook.Sign([]byte(secret), []byte("{}"))}, 401},
		{"wrong secret", good, map[string]string{"X-Hub-Signature-256": webhook.Sign([]byte("other"), good)}, 401},
		{"missing event", good, map[string]string{"X-GitHub-Event": ""}, 400},
		{"missing delivery", good, map[string]string{"X-GitHub-Delivery": ""}, 400},
		{"delivery not UTF-8", good, map[string]string{"X-GitHub-Delivery": "abc\xff"}, 400},
		{"delivery with a space", good, map[string]string{"X-GitHub-Delivery": "a b"}, 400},
		{"malformed json", []byte(`{"zen":`), nil, 400},
		{"oversize", bytes.Repeat([]byte("x"), 5000), nil, 413},
		{"form content type", good, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"no content type", good, map[string]string{"Content-Type": ""}, 415},
	}
	for _, tc := range cases {
		before := b.counts(t)
		body := tc.body
		h := tc.header
		if tc.name == "malformed json" || tc.name == "oversize" {
			h = map[string]string{"X-Hub-Signature-256": webhook.Sign([]byte(secret), body)}
		}
		if code := b.post(t, "ping", "bad-"+strings.ReplaceAll(tc.name, " ", "-"), body, h); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
		if after := b.counts(t); after != before {
			t.Errorf("%s: inbox/jobs %v → %v: bad input wrote something", tc.name, before, after)
		}
	}
	if _, err := controlplane.New(b.pool, controlplane.Config{WebhookSecret: []byte("")}, nil, nil); err != controlplane.ErrNoWebhookSecret {
		t.Fatalf("empty secret at start: %v, want ErrNoWebhookSecret", err)
	}
}
