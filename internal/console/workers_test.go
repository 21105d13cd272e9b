package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/server"
	"github.com/pgoutbox/pgoutbox/projection"
)

const cronSecret = "cron-secret-value"

// workersEnv is the workers page mounted as `serve` mounts it (with the
// console, behind tok when set), for a record projection configured with
// pcfg and a process whose workers serve served.
type workersEnv struct {
	*env
	app *projection.App
}

func newWorkersEnv(t *testing.T, tok string, pcfg projection.Config, served ...string) *workersEnv {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	return newWorkersEnvOn(t, pool, tok, pcfg, served...)
}

func newWorkersEnvOn(t *testing.T, pool *pgxpool.Pool, tok string, pcfg projection.Config, served ...string) *workersEnv {
	t.Helper()
	app, err := projection.New(pool, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Pool: pool, OperatorToken: tok})
	if err != nil {
		t.Fatal(err)
	}
	s := server.NewWithOptions(nil, nil, server.Options{OperatorToken: tok})
	s.HandleOperatorSelfAuth(console.Prefix, c.Handler())
	s.HandleOperatorSelfAuth("GET "+console.WorkersPath, c.Workers(console.WorkersConfig{Served: served, Projection: app}))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &workersEnv{env: &env{ctx: t.Context(), pool: pool, srv: srv, logs: &syncBuffer{}}, app: app}
}

// importN imports records r1..rn titled title through the projection's
// importer (one record.upsert each for a new or changed record).
func (w *workersEnv) importN(t *testing.T, n int, title string) {
	t.Helper()
	var sb strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&sb, `{"id":"r%d","title":"%s %d","n":%d}`+"\n", i, title, i, i)
	}
	if res, err := projection.Import(w.ctx, w.pool, projection.FormatNDJSON, strings.NewReader(sb.String()), 0, 0, 0); err != nil || res.Rejected != 0 {
		t.Fatalf("import: %+v %v", res, err)
	}
}

// get fetches path with the bearer tok ("" for none) and extra headers.
func (w *workersEnv) get(t *testing.T, path, tok string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, w.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

func (w *workersEnv) report(t *testing.T) console.WorkersReport {
	t.Helper()
	code, out, _ := w.get(t, "/workers?format=json", "")
	if code != 200 {
		t.Fatalf("json: %d %s", code, out)
	}
	var rep console.WorkersReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return rep
}

func queueOf(rep console.WorkersReport, name string) *console.QueueReport {
	for i := range rep.Queues {
		if rep.Queues[i].Queue == name {
			return &rep.Queues[i]
		}
	}
	return nil
}

// TestWorkersPage: the backlog by state, the window's completions (never
// the retained history), the dead letters, the projection's state; never a
// payload or a secret.
func TestWorkersPage(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, "", projection.Config{
		CronSecret: cronSecret,
		Disabled:   map[string]string{projection.TargetSolr: "OUTBOX_PROJECT_TO_SOLR is not 1"},
	})
	w.importN(t, 4, "SecretTitle")
	// One dead letter with a last error, one retrying effect, one leased.
	leases, err := pgoutbox.ClaimLeases(w.ctx, w.pool, projection.Queue, "t", 3, time.Minute)
	if err != nil || len(leases) != 3 {
		t.Fatal(err)
	}
	if _, err := leases[0].Fail(w.ctx, w.pool, pgoutbox.Permanent(errors.New("solr: update: HTTP 400: bad field")), true, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := leases[1].Fail(w.ctx, w.pool, pgoutbox.Retry(errors.New("HTTP 503")), true, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Another queue's history: one completion three hours ago (retained,
	// outside the window: /workers must not read it) and one just now.
	w.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, created_at, completed_at)
		VALUES ('history', 't', 'old', 'completed', now() - interval '3 hours', now() - interval '3 hours'),
		       ('history', 't', 'new', 'completed', now() - interval '2 seconds', now())`)
	rep := w.report(t)
	history := queueOf(rep, "history")
	if history == nil || history.States["completed"] != 1 || history.CompletedInWindow != 1 || history.MeanLagSeconds < 1 {
		t.Fatalf("completed within the window: %+v", history)
	}
	q := queueOf(rep, projection.Queue)
	if q == nil || q.States["available"] != 2 || q.States["leased"] != 1 || q.States["dead_letter"] != 1 || q.Retrying != 1 || q.Served {
		t.Fatalf("backlog: %+v", q)
	}
	p := rep.Projection
	if p == nil || p.Records != 4 || p.LagSeconds <= 0 {
		t.Fatalf("projection: %+v", p)
	}
	if len(rep.Attention) != 1 || !strings.Contains(rep.Attention[0].LastError, "HTTP 400") {
		t.Fatalf("attention: %+v", rep.Attention)
	}
	if p.Targets[0].Enabled || p.Targets[0].Reason != "OUTBOX_PROJECT_TO_SOLR is not 1" {
		t.Fatalf("targets: %+v", p.Targets)
	}
	if p.NextDrain.At != nil || !strings.Contains(p.NextDrain.Why, "no projection target") {
		t.Fatalf("next drain: %+v", p.NextDrain)
	}
	if !p.Cron.NextWakeUp.After(rep.GeneratedAt) || p.Cron.NextWakeUp.Minute()%5 != 0 {
		t.Fatalf("next cron wake-up %v", p.Cron.NextWakeUp)
	}
	code, page, hdr := w.get(t, "/workers", "")
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("html: %d %v", code, hdr)
	}
	for _, want := range []string{`data-queue="outbox_events"`, `data-state="available">2<`, `data-state="dead_letter">1<`,
		"HTTP 400: bad field", "OUTBOX_PROJECT_TO_SOLR is not 1", "pending → available", "setTimeout(refresh"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Never payloads or secrets.
	_, out, _ := w.get(t, "/workers?format=json", "")
	for _, body := range []string{page, out} {
		for _, secret := range []string{"SecretTitle", cronSecret, token, "record_id"} {
			if strings.Contains(body, secret) {
				t.Errorf("the workers page shows %q", secret)
			}
		}
	}
}

// TestWorkersPageServedQueues (issue 30): a process whose workers serve
// the projection's queue says so and drains now, not "never"; a queue it
// serves, or one a worker sampled within the hour, stays listed while
// idle.
func TestWorkersPageServedQueues(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, "", projection.Config{Solr: solrConfig()}, projection.Queue, "idle-served")
	w.sample(t, "idle-sampled", 5, 0, 0)
	rep := w.report(t)
	for _, name := range []string{projection.Queue, "idle-served", "idle-sampled"} {
		q := queueOf(rep, name)
		if q == nil || q.States["available"] != 0 {
			t.Fatalf("idle queue %q not listed: %+v", name, rep.Queues)
		}
		if q.Served != (name != "idle-sampled") {
			t.Errorf("queue %q served %v", name, q.Served)
		}
	}
	p := rep.Projection
	if p == nil || !p.InProcessWorkers || p.NextDrain.At == nil || !strings.Contains(p.NextDrain.By, "workers of this server") {
		t.Fatalf("projection: %+v", p)
	}
	_, page, _ := w.get(t, "/workers", "")
	if !strings.Contains(page, `<td id="in-process">yes</td>`) || strings.Contains(page, `never</span>`) {
		t.Fatalf("the page does not say the workers run here:\n%s", page)
	}
}

// TestWorkersPageLiveWorkersElsewhere: a worker process serving the
// projection's queue elsewhere (its heartbeat, ops.LiveWorkers) drains it:
// the page counts it and the next drain is now, not "never", though this
// process serves nothing.
func TestWorkersPageLiveWorkersElsewhere(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, "", projection.Config{Solr: solrConfig()})
	c, err := pgoutbox.NewClient(w.pool, pgoutbox.Config{ID: "elsewhere-1", Queues: map[string]pgoutbox.QueueConfig{projection.Queue: {}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(w.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.WithoutCancel(w.ctx)) })
	// The heartbeat writes the worker's row in its own goroutine after
	// Start returns: wait for the row, not for luck (under load the report
	// ran first: 'live workers []').
	pgtest.WaitFor(t, w.ctx, "the worker's first heartbeat", func() bool {
		return pgtest.Scalar(t, w.ctx, w.pool, `SELECT count(*) FROM pgoutbox.workers WHERE id = 'elsewhere-1'`) == 1
	})
	rep := w.report(t)
	q := queueOf(rep, projection.Queue)
	if q == nil || q.LiveWorkers != 1 || q.Served || len(rep.LiveWorkers) != 1 || rep.LiveWorkers[0].ID != "elsewhere-1" {
		t.Fatalf("queue %+v, live workers %+v", q, rep.LiveWorkers)
	}
	p := rep.Projection
	if p == nil || p.InProcessWorkers || p.LiveWorkers != 1 || p.NextDrain.At == nil || !strings.Contains(p.NextDrain.By, "1 live worker") {
		t.Fatalf("projection: %+v", p)
	}
}

// solrConfig turns the Solr target on (no request is sent by these tests).
func solrConfig() *solr.Config { return &solr.Config{BaseURL: "http://127.0.0.1:1", Core: "c"} }

// TestWorkersPageSession (issue 30): with an operator token, a
// browser signed in to the console reads /workers with its session
// cookie; without it a browser is sent to the sign-in and a script gets
// 401; the bearer token still reads.
func TestWorkersPageSession(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, token, projection.Config{})
	if code, body, hdr := w.get(t, "/workers", "", "Accept", "text/html,application/xhtml+xml"); code != http.StatusSeeOther ||
		hdr.Get("Location") != "/console/signin" || strings.Contains(body, "outbox_events") {
		t.Fatalf("browser without a session: %d %v %.200s, want a redirect to the sign-in", code, hdr, body)
	}
	for _, tok := range []string{"", "wrong"} {
		if code, body, _ := w.get(t, "/workers?format=json", tok); code != http.StatusUnauthorized || strings.Contains(body, "outbox_events") {
			t.Fatalf("script with token %q: %d %.200s, want 401", tok, code, body)
		}
	}
	if code, body, _ := w.get(t, "/workers?format=json", token); code != http.StatusOK || !strings.Contains(body, "outbox_events") {
		t.Fatalf("bearer: %d %.200s", code, body)
	}
	c := w.client(t)
	w.signIn(t, c, "ada")
	resp, err := c.Get(w.srv.URL + "/workers")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-queue="outbox_events"`) {
		t.Fatalf("signed-in browser: %d %.300s", resp.StatusCode, body)
	}
	// Signed out, the same cookie reads nothing.
	csrf := w.signIn(t, c, "ada")
	if a := do(t, c, "POST", w.srv.URL+"/console/signout", url.Values{"csrf": {csrf}}); a.code != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", a.code)
	}
	if a := do(t, c, "GET", w.srv.URL+"/workers?format=json", nil); a.code != http.StatusUnauthorized {
		t.Fatalf("signed out: %d %.200s, want 401", a.code, a.body)
	}
}

// TestWorkersPageShowsBlockedKeys: /workers lists the ordering keys whose
// effects wait, and the head that holds each back: here a record's second
// version waits behind its first, which is leased (in delivery).
func TestWorkersPageShowsBlockedKeys(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, "", projection.Config{CronSecret: cronSecret})
	err := pgx.BeginFunc(w.ctx, w.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(w.ctx, tx, []pgoutbox.Effect{
			{Queue: projection.Queue, Type: projection.EffectType, Key: "v1", OrderingKey: "rec-42"},
			{Queue: projection.Queue, Type: projection.EffectType, Key: "v2", OrderingKey: "rec-42"},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := pgoutbox.ClaimLeases(w.ctx, w.pool, projection.Queue, "t", 10, time.Minute)
	if err != nil || len(leases) != 1 || leases[0].Key != "v1" {
		t.Fatalf("claimed %d leases (%v), want v1 alone: v2 waits behind it", len(leases), err)
	}
	rep := w.report(t)
	if len(rep.Blocked) != 1 || rep.Blocked[0].OrderingKey != "rec-42" || rep.Blocked[0].Waiting != 1 ||
		rep.Blocked[0].HeadID != leases[0].ID || rep.Blocked[0].HeadState != "leased" || rep.Blocked[0].Stuck {
		t.Fatalf("blocked keys: %+v", rep.Blocked)
	}
	_, html, _ := w.get(t, "/workers", "")
	if !strings.Contains(html, `<table id="blocked">`) || !strings.Contains(html, "<td>rec-42</td>") {
		t.Fatalf("the page does not list the blocked key:\n%s", html)
	}
}
