package httpdelivery_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/httpdelivery"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// secret is the Standard Webhooks specification's example secret.
const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// TestSignMatchesTheSpecification: the signature of the specification's
// example message is the one the specification publishes.
func TestSignMatchesTheSpecification(t *testing.T) {
	key, err := httpdelivery.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	got := httpdelivery.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("Sign: %s, want the specification's %s", got, want)
	}
}

func TestParseSecretRefuses(t *testing.T) {
	for _, s := range []string{"", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!", "whsec_c2hvcnQ=", "whsec_" + strings.Repeat("QUFB", 30)} {
		if _, err := httpdelivery.ParseSecret(s); err == nil {
			t.Errorf("ParseSecret(%q) accepted", s)
		} else if len(s) > 12 && strings.Contains(err.Error(), s[6:]) {
			t.Errorf("ParseSecret's error quotes the secret: %v", err)
		}
	}
}

// received is one request the test endpoint got.
type received struct {
	header http.Header
	body   []byte
}

// endpoint is a real HTTP server whose answer to each request is chosen by
// the effect's key (the webhook-id's payload "answer" field).
type endpoint struct {
	srv      *httptest.Server
	mu       sync.Mutex
	got      map[string][]received // by webhook-id
	inFlight atomic.Int64
	maxIn    atomic.Int64
	gate     chan struct{} // "gate" answers wait for it
	openAt   int64         // the gate opens when this many requests are in flight
	open     sync.Once
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{got: map[string][]received{}, gate: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *endpoint) serve(w http.ResponseWriter, r *http.Request) {
	n := e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	for m := e.maxIn.Load(); n > m && !e.maxIn.CompareAndSwap(m, n); m = e.maxIn.Load() {
	}
	if e.openAt > 0 && n >= e.openAt {
		e.open.Do(func() { close(e.gate) })
	}
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get("webhook-id")
	e.mu.Lock()
	e.got[id] = append(e.got[id], received{header: r.Header.Clone(), body: body})
	e.mu.Unlock()
	var env struct {
		Data struct {
			Answer string `json:"answer"`
		} `json:"data"`
	}
	_ = json.Unmarshal(body, &env)
	switch a := env.Data.Answer; a {
	case "gate":
		<-e.gate
		w.WriteHeader(http.StatusNoContent)
	case "hangup": // the request arrived whole; the answer never leaves
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	case "big":
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(strings.Repeat("x", 4<<20)))
	case "bigerror":
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(strings.Repeat("e", 1<<20)))
	case "429":
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(http.StatusTooManyRequests)
	case "302":
		w.Header().Set("Location", "/elsewhere")
		w.WriteHeader(http.StatusFound)
	default:
		code, err := strconv.Atoi(a)
		if err != nil {
			code = http.StatusOK
		}
		w.WriteHeader(code)
		_, _ = w.Write([]byte("answer " + a))
	}
}

func (e *endpoint) requests(id string) []received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got[id]
}

// run delivers effects (key → answer, type) through one Client whose types
// are delivered to ep, and waits until each has reached a state other than
// available with attempts 0; it returns their rows.
func run(t *testing.T, ep httpdelivery.Endpoint, effects []testEffect, settle func(pgtest.Effect) bool) (map[string]pgtest.Effect, *httpdelivery.Deliverer) {
	t.Helper()
	b := pgtest.NewBundle(t, 2*time.Minute)
	d, err := httpdelivery.New(ep, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgoutbox.NewClient(b.Pool, pgoutbox.Config{
		SweepInterval: -1, PruneInterval: -1, Logger: slog.New(slog.DiscardHandler),
		Queues: map[string]pgoutbox.QueueConfig{"hooks": {Concurrency: 10}},
		Types: []pgoutbox.EffectType{
			{Name: "hook.safe", ReplaySafe: true, Handler: d.Handler()},
			{Name: "hook.once", ReplaySafe: false, Handler: d.Handler()},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	if err := pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		for _, e := range effects {
			id, err := pgoutbox.Enqueue(b.Ctx, tx, pgoutbox.Effect{Queue: "hooks", Type: e.typ, Key: e.key,
				Payload: map[string]any{"answer": e.answer, "n": 1e3}, MaxAttempts: 3})
			if err != nil {
				return err
			}
			ids[e.key] = id
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.Ctx); err != nil {
		t.Fatal(err)
	}
	rows := map[string]pgtest.Effect{}
	for k, id := range ids {
		pgtest.WaitFor(t, b.Ctx, "effect "+k+" delivered once", func() bool {
			r := pgtest.ReadEffect(t, b.Ctx, b.Pool, id)
			rows[k] = r
			return r.Attempts >= 1 && r.State != "leased" && (settle == nil || settle(r))
		})
	}
	if err := c.Stop(b.Ctx); err != nil {
		t.Fatal(err)
	}
	return rows, d
}

type testEffect struct{ key, answer, typ string }

// TestOutcomesFollowTheAnswer: each answer becomes the outcome a Go handler
// would return, for the replay-safe type and for the one that is not.
func TestOutcomesFollowTheAnswer(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	effects := []testEffect{
		{"ok", "200", "hook.safe"}, {"accepted", "202", "hook.once"},
		{"slow-down", "429", "hook.safe"}, {"unavailable", "503", "hook.once"},
		{"broken", "500", "hook.safe"}, {"timeout-answer", "408", "hook.once"},
		{"bad", "400", "hook.safe"}, {"gone", "410", "hook.once"}, {"moved", "302", "hook.safe"},
		{"hangup-safe", "hangup", "hook.safe"}, {"hangup-once", "hangup", "hook.once"},
		{"big", "big", "hook.safe"}, {"bigerror", "bigerror", "hook.safe"},
	}
	rows, _ := run(t, httpdelivery.Endpoint{Name: "svc", URL: e.srv.URL + "/hooks?token=query-secret", Secret: secret}, effects, nil)
	want := map[string]string{
		"ok": "completed", "accepted": "completed", "big": "completed",
		"slow-down": "available", "unavailable": "available", "broken": "available", "timeout-answer": "available",
		"hangup-safe": "available", "bigerror": "available",
		"bad": "dead_letter", "gone": "dead_letter", "moved": "dead_letter",
		"hangup-once": "reconciliation_required",
	}
	for k, st := range want {
		if rows[k].State != st {
			t.Errorf("%s: %s (%v), want %s", k, rows[k].State, str(rows[k].LastError), st)
		}
	}
	if in := rows["slow-down"].AvailableIn; in < 100 || in > 121 {
		t.Errorf("429 with Retry-After 120: available in %.0f s, want about 120", in)
	}
	if le := str(rows["bigerror"].LastError); len(le) > 700 || !strings.Contains(le, "answered 500") {
		t.Errorf("a 1 MiB error answer: last_error of %d bytes %.80q, want at most ~%d naming the status", len(le), le, httpdelivery.ErrorExcerptBytes)
	}
	for k, r := range rows {
		if strings.Contains(str(r.LastError), "query-secret") {
			t.Errorf("%s: last_error carries the URL's query: %s", k, str(r.LastError))
		}
	}
	if n := len(e.requests("moved")); n != 1 {
		t.Errorf("302: %d requests, want 1 (a redirect is never followed)", n)
	}
	// The request as the specification says.
	reqs := e.requests("ok")
	if len(reqs) != 1 {
		t.Fatalf("ok: %d requests, want 1", len(reqs))
	}
	h := reqs[0].header
	key, _ := httpdelivery.ParseSecret(secret)
	ts, err := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
	if err != nil || h.Get("webhook-signature") != httpdelivery.Sign(key, "ok", ts, reqs[0].body) ||
		h.Get("content-type") != "application/json" || h.Get("pgoutbox-attempt") != "1" || h.Get("pgoutbox-effect-type") != "hook.safe" {
		t.Errorf("headers: %v", h)
	}
	var env struct {
		Type      string          `json:"type"`
		Timestamp time.Time       `json:"timestamp"`
		Data      json.RawMessage `json:"data"`
	}
	var data map[string]any
	if err := json.Unmarshal(reqs[0].body, &env); err != nil || env.Type != "hook.safe" || env.Timestamp.IsZero() ||
		json.Unmarshal(env.Data, &data) != nil || data["answer"] != "200" || data["n"] != 1000.0 || len(data) != 2 {
		t.Errorf("body %s: %+v %v", reqs[0].body, env, err)
	}
}

// TestNothingSentIsARetry: a request that never left (the endpoint refuses
// the connection) is a retry even for a type that is not replay-safe: the
// endpoint cannot have acted, so it is not an unknown outcome.
func TestNothingSentIsARetry(t *testing.T) {
	t.Parallel()
	rows, _ := run(t, httpdelivery.Endpoint{Name: "down", URL: closedURL(t), Secret: secret},
		[]testEffect{{"refused", "200", "hook.once"}}, nil)
	if r := rows["refused"]; r.State != "available" || !strings.Contains(str(r.LastError), "down") {
		t.Fatalf("refused connection, not replay-safe: %s (%s), want available (a retry)", r.State, str(r.LastError))
	}
}

// TestConcurrencyPerEndpoint: however many workers the queue has, at most
// Endpoint.Concurrency requests are in flight to the endpoint.
func TestConcurrencyPerEndpoint(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	effects := make([]testEffect, 8)
	for i := range effects {
		effects[i] = testEffect{fmt.Sprint("g", i), "gate", "hook.safe"}
	}
	// The gate opens once the bound is reached, so requests wait at the
	// bound: a third in flight would show in maxIn.
	e.openAt = 2
	rows, d := run(t, httpdelivery.Endpoint{Name: "svc", URL: e.srv.URL, Secret: secret, Concurrency: 2}, effects, nil)
	for k, r := range rows {
		if r.State != "completed" {
			t.Errorf("%s: %s", k, r.State)
		}
	}
	if m := e.maxIn.Load(); m != 2 || d.MaxInFlight() != 2 {
		t.Fatalf("most requests in flight: endpoint saw %d, deliverer %d; want 2", m, d.MaxInFlight())
	}
}

func TestNewRefuses(t *testing.T) {
	for _, ep := range []httpdelivery.Endpoint{
		{URL: "http://x", Secret: secret},
		{Name: "a", URL: "ftp://x", Secret: secret},
		{Name: "a", URL: "http://user:pw@x/", Secret: secret},
		{Name: "a", URL: "http://x", Secret: "nope"},
		{Name: "a", URL: "http://x", Secret: secret, Concurrency: -1},
	} {
		if _, err := httpdelivery.New(ep, nil); err == nil {
			t.Errorf("New(%+v) accepted", ep)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("the error quotes credentials: %v", err)
		}
	}
}

// closedURL is the URL of a port nothing listens on.
func closedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr + "/hooks"
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
