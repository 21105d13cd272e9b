package console_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/server"
)

func TestMain(m *testing.M) { pgtest.Main(m, func() error { return goleak.Find() }) }

const token = "op-console-token-5f2a9c"

// syncBuffer is a log sink the handlers write to concurrently.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is a console served the way `serve` mounts it, on a database of its
// own.
type env struct {
	ctx  context.Context
	pool *pgxpool.Pool
	srv  *httptest.Server
	logs *syncBuffer
}

// newClockedEnv serves a console alone (no control plane) on a fresh
// database, with cfg and a clock of its own, which advance moves forward.
func newClockedEnv(t *testing.T, cfg console.Config) (e *env, advance func(time.Duration)) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	cfg.Pool = pool
	cfg.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return &env{ctx: t.Context(), pool: pool, srv: srv, logs: &syncBuffer{}},
		func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

func newEnv(t *testing.T, tok string, tlsServer bool) *env {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cp, err := controlplane.ForOperations(pool, controlplane.Config{}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Pool: pool, OperatorToken: tok, ControlPlane: cp, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	s := server.NewWithOptions(log, nil, server.Options{OperatorToken: tok})
	s.HandleOperatorSelfAuth(console.Prefix, c.Handler())
	var srv *httptest.Server
	if tlsServer {
		srv = httptest.NewTLSServer(s.Handler())
	} else {
		srv = httptest.NewServer(s.Handler())
	}
	t.Cleanup(srv.Close)
	return &env{ctx: t.Context(), pool: pool, srv: srv, logs: logs}
}

func (e *env) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(e.ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (e *env) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// deadLetter inserts a dead letter and returns its id.
func (e *env) deadLetter(t *testing.T, queue, key, lastError, payload string) int64 {
	t.Helper()
	var id int64
	err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state,
		attempts, dead_lettered_at, last_error) VALUES ($1, 'test.effect', $2, $3, 'dead_letter', 8, now(), $4) RETURNING id`,
		queue, key, payload, lastError).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// reconciliationRecord inserts a dispatch whose outcome is unknown.
func (e *env) reconciliationRecord(t *testing.T, queue string) int64 {
	t.Helper()
	var id int64
	err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state,
		attempts, delivery_started_at, reconciliation_at, last_error)
		VALUES ($1, 'github.workflow.dispatch', 'dispatch:' || gen_random_uuid(),
		'{"release_run_id": 12, "execution_attempt_id": 34, "attempt_number": 1, "installation_id": 5,
		  "repository": "acme/api", "workflow": "release.yml", "ref": "v1.2.3"}',
		'reconciliation_required', 1, now(), now(), 'dispatch: timeout after sending') RETURNING id`, queue).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// sample persists a worker's sample of queue taken minutesAgo (and 10 s).
func (e *env) sample(t *testing.T, queue string, minutesAgo int, completions int64, oldestAge float64) {
	t.Helper()
	e.exec(t, `INSERT INTO pgoutbox.samples (sampled_at, queue, worker, interval_s, claims, completions, failures,
		oldest_available_age_s, completed_per_second, workers_healthy)
		VALUES (now() - make_interval(mins => $2, secs => 10), $1, 'w1', 60, $3::bigint, $3::bigint, 0, $4, $3::bigint / 60.0, true)`,
		queue, minutesAgo, completions, oldestAge)
}

func (e *env) state(t *testing.T, id int64) string {
	t.Helper()
	var s string
	if err := e.pool.QueryRow(e.ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// client returns an HTTP client with a cookie jar that does not follow
// redirects.
func (e *env) client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := *e.srv.Client() // a copy: the server's client is shared
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &c
}

type answer struct {
	code int
	body string
	resp *http.Response
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values) answer {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{code: resp.StatusCode, body: string(b), resp: resp}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// signIn signs c in as operator and returns the session's CSRF token.
func (e *env) signIn(t *testing.T, c *http.Client, operator string) string {
	t.Helper()
	a := do(t, c, "POST", e.srv.URL+"/console/signin", url.Values{"token": {token}, "operator": {operator}})
	if a.code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", a.code, a.body)
	}
	page := do(t, c, "GET", e.srv.URL+"/console/dead-letters", nil)
	m := csrfRE.FindStringSubmatch(page.body)
	if page.code != 200 || m == nil {
		t.Fatalf("no CSRF token on the dead-letter page after sign-in: %d %s", page.code, page.body)
	}
	return m[1]
}

// TestSignIn pins the session cookie's attributes, that a wrong token buys
// nothing, that pages need the session (or the bearer token) when a token
// is configured, and that the token never reaches the log.
func TestSignIn(t *testing.T) {
	t.Parallel()
	for _, tlsServer := range []bool{false, true} {
		e := newEnv(t, token, tlsServer)
		c := e.client(t)
		if a := do(t, c, "GET", e.srv.URL+"/console/effects", nil); a.code != http.StatusSeeOther ||
			a.resp.Header.Get("Location") != "/console/signin" {
			t.Fatalf("effects without a session: %d (Location %q), want a redirect to the sign-in", a.code, a.resp.Header.Get("Location"))
		}
		a := do(t, c, "POST", e.srv.URL+"/console/signin", url.Values{"token": {"wrong-" + token}})
		if a.code != http.StatusForbidden || len(a.resp.Cookies()) != 0 || !strings.Contains(a.body, "Wrong operator token") {
			t.Fatalf("wrong token: %d, cookies %v", a.code, a.resp.Cookies())
		}
		a = do(t, c, "POST", e.srv.URL+"/console/signin", url.Values{"token": {token}, "operator": {"alice"}})
		if a.code != http.StatusSeeOther || len(a.resp.Cookies()) != 1 {
			t.Fatalf("sign-in: %d, cookies %v", a.code, a.resp.Cookies())
		}
		ck := a.resp.Cookies()[0]
		if ck.Name != console.CookieName || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != console.CookiePath ||
			ck.Secure != tlsServer || len(ck.Value) != 64 {
			t.Fatalf("tls %v: cookie %+v: want HttpOnly, SameSite=Strict, Path=/ (CookiePath), Secure=%v, a 256-bit id",
				tlsServer, ck, tlsServer)
		}
		if a := do(t, c, "GET", e.srv.URL+"/console/effects", nil); a.code != 200 || !strings.Contains(a.body, `id="operator">alice<`) {
			t.Fatalf("effects with a session: %d", a.code)
		}
		req, _ := http.NewRequest("GET", e.srv.URL+"/console/audit", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("audit with the bearer token: %d", resp.StatusCode)
		}
		// Signing out ends the session server-side: the old cookie is
		// worthless even if a browser kept it.
		csrf := e.signIn(t, c, "alice")
		old := c.Jar.Cookies(mustURL(t, e.srv.URL+"/console/"))
		if a := do(t, c, "POST", e.srv.URL+"/console/signout", url.Values{"csrf": {csrf}}); a.code != http.StatusSeeOther {
			t.Fatalf("sign-out: %d", a.code)
		}
		c.Jar.SetCookies(mustURL(t, e.srv.URL+"/console/"), old)
		if a := do(t, c, "GET", e.srv.URL+"/console/effects", nil); a.code != http.StatusSeeOther {
			t.Fatalf("effects with a signed-out session: %d", a.code)
		}
		if logs := e.logs.String(); strings.Contains(logs, token) || !strings.Contains(logs, "console sign-in refused") {
			t.Fatalf("log holds the token, or not the refusal:\n%s", logs)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestActionsNeedSessionAndCSRF: a replay POST without the session, without
// the CSRF token, with another session's token or a wrong one is refused
// with 403 and changes nothing: no effect moves, no audit row appears.
func TestActionsNeedSessionAndCSRF(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	id := e.deadLetter(t, "q1", "k1", "boom", `{}`)
	alice, mallory := e.client(t), e.client(t)
	aliceCSRF := e.signIn(t, alice, "alice")
	malloryCSRF := e.signIn(t, mallory, "mallory")
	if aliceCSRF == malloryCSRF {
		t.Fatal("two sessions share a CSRF token")
	}
	anonymous := e.client(t)
	form := func(csrf string) url.Values {
		v := url.Values{"mode": {"ids"}, "id": {strconv.FormatInt(id, 10)}, "confirm": {"1"}}
		if csrf != "" {
			v.Set("csrf", csrf)
		}
		return v
	}
	countState := `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`
	countAudit := `SELECT count(*) FROM pgoutbox.console_audit`
	deadBefore, auditBefore := e.count(t, countState), e.count(t, countAudit)
	for name, tc := range map[string]struct {
		c    *http.Client
		form url.Values
	}{
		"no session":           {anonymous, form(aliceCSRF)},
		"no CSRF token":        {alice, form("")},
		"wrong CSRF token":     {alice, form(strings.Repeat("0", 64))},
		"other session's CSRF": {alice, form(malloryCSRF)},
	} {
		a := do(t, tc.c, "POST", e.srv.URL+"/console/replay", tc.form)
		if a.code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", name, a.code)
		}
	}
	if d, au := e.count(t, countState), e.count(t, countAudit); d != deadBefore || au != auditBefore || e.state(t, id) != "dead_letter" {
		t.Fatalf("refused POSTs changed something: dead letters %d → %d, audit rows %d → %d", deadBefore, d, auditBefore, au)
	}
	// The same POST with the session and its token works.
	if a := do(t, alice, "POST", e.srv.URL+"/console/replay", form(aliceCSRF)); a.code != 200 || e.state(t, id) != "available" {
		t.Fatalf("replay with session and CSRF: %d, state %s: %s", a.code, e.state(t, id), a.body)
	}
}

// TestReplay: the first step counts and changes nothing, the second replays
// at most the confirmed count of the dead letters shown and records who did
// it in the audit (shown on the audit page); a reconciliation record is
// never replayed, neither by id nor as part of its queue.
func TestReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	var q1 []int64
	for i := range 3 {
		q1 = append(q1, e.deadLetter(t, "q1", "k"+strconv.Itoa(i), "solr: HTTP 401", `{"record_id": "r`+strconv.Itoa(i)+`"}`))
	}
	other := e.deadLetter(t, "q2", "k9", "boom", `{}`)
	rec := e.reconciliationRecord(t, "q1")
	c := e.client(t)
	csrf := e.signIn(t, c, "alice")

	a := do(t, c, "POST", e.srv.URL+"/console/replay", url.Values{"csrf": {csrf}, "mode": {"queue"}, "queue": {"q1"}})
	if a.code != 200 || !strings.Contains(a.body, "Replay <b>3</b> dead letter(s) of queue q1") ||
		!strings.Contains(a.body, `name="confirm" value="3"`) {
		t.Fatalf("step one: %d %s", a.code, a.body)
	}
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`); n != 4 {
		t.Fatalf("step one moved effects: %d dead letters left, want 4", n)
	}
	// Confirming 2 replays 2: the count caps the replay of the ids shown.
	form := confirmForm(t, a.body)
	if got := strings.Join(form["id"], ","); got != joinIDs(q1) {
		t.Fatalf("the confirmation names %s, want the dead letters shown, %s", got, joinIDs(q1))
	}
	form.Set("confirm", "2")
	a = do(t, c, "POST", e.srv.URL+"/console/replay", form)
	if a.code != 200 || !strings.Contains(a.body, "Replayed 2 of 2 confirmed") {
		t.Fatalf("step two: %d %s", a.code, a.body)
	}
	if e.state(t, q1[0]) != "available" || e.state(t, q1[1]) != "available" || e.state(t, q1[2]) != "dead_letter" ||
		e.state(t, other) != "dead_letter" || e.state(t, rec) != "reconciliation_required" {
		t.Fatalf("after replaying 2 of q1: %s %s %s, q2 %s, record %s", e.state(t, q1[0]), e.state(t, q1[1]),
			e.state(t, q1[2]), e.state(t, other), e.state(t, rec))
	}
	// By id, the reconciliation record is skipped with the reason.
	ids := url.Values{"csrf": {csrf}, "mode": {"ids"}, "id": {strconv.FormatInt(q1[2], 10), strconv.FormatInt(rec, 10)}}
	a = do(t, c, "POST", e.srv.URL+"/console/replay", ids)
	if a.code != 200 || !strings.Contains(a.body, "Replay <b>1</b>") || !strings.Contains(a.body, "never replayed") {
		t.Fatalf("step one by id: %d %s", a.code, a.body)
	}
	ids.Set("confirm", "2")
	a = do(t, c, "POST", e.srv.URL+"/console/replay", ids)
	if a.code != 200 || e.state(t, q1[2]) != "available" || e.state(t, rec) != "reconciliation_required" {
		t.Fatalf("replay by id: %d, dead letter %s, record %s", a.code, e.state(t, q1[2]), e.state(t, rec))
	}
	var op, sess, action, target, outcome string
	var changed int
	if err := e.pool.QueryRow(e.ctx, `SELECT operator, session, action, target, changed, outcome FROM pgoutbox.console_audit
		ORDER BY id`).Scan(&op, &sess, &action, &target, &changed, &outcome); err != nil {
		t.Fatal(err)
	}
	if op != "alice" || len(sess) != 12 || action != "replay" || target != "queue q1 (the dead letters shown: ids "+joinIDs(q1)+")" || changed != 2 {
		t.Fatalf("audit row: %q %q %q %q %d %q", op, sess, action, target, changed, outcome)
	}
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.console_audit WHERE action = 'replay'`); n != 2 {
		t.Fatalf("%d replay audit rows, want 2", n)
	}
	page := do(t, c, "GET", e.srv.URL+"/console/audit", nil)
	if page.code != 200 || !strings.Contains(page.body, "queue q1 (the dead letters shown") || !strings.Contains(page.body, "skipped 1") {
		t.Fatalf("audit page: %d %s", page.code, page.body)
	}
	// Bad input is refused and changes nothing.
	before := e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`)
	for _, f := range []url.Values{
		{"csrf": {csrf}, "mode": {"ids"}, "id": {"x"}, "confirm": {"1"}},
		{"csrf": {csrf}, "mode": {"ids"}, "confirm": {"1"}},
		{"csrf": {csrf}, "mode": {"queue"}, "confirm": {"1"}},
		{"csrf": {csrf}, "mode": {"queue"}, "queue": {"q2"}, "confirm": {"-1"}},
		{"csrf": {csrf}, "mode": {"queue"}, "queue": {"q2"}, "confirm": {"1"}}, // no ids shown
		{"csrf": {csrf}, "mode": {"everything"}, "confirm": {"1"}},
	} {
		if a := do(t, c, "POST", e.srv.URL+"/console/replay", f); a.code != http.StatusBadRequest {
			t.Errorf("%v: %d, want 400", f, a.code)
		}
	}
	if e.state(t, other) != "dead_letter" || e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`) != before {
		t.Fatal("bad input changed something")
	}
}

// TestReadOnly: without an operator token every page is open and says it is
// read-only, nobody can sign in, and every action is refused and changes
// nothing.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	id := e.deadLetter(t, "q1", "k1", "boom", `{}`)
	c := e.client(t)
	for _, p := range []string{"/console/effects", "/console/dead-letters", "/console/reconciliation", "/console/audit",
		"/console/effects/" + strconv.FormatInt(id, 10)} {
		if a := do(t, c, "GET", e.srv.URL+p, nil); a.code != 200 || !strings.Contains(a.body, `id="readonly"`) {
			t.Errorf("%s: %d, read-only banner %v", p, a.code, strings.Contains(a.body, `id="readonly"`))
		}
	}
	if a := do(t, c, "POST", e.srv.URL+"/console/signin", url.Values{"token": {""}}); a.code != http.StatusForbidden ||
		len(a.resp.Cookies()) != 0 {
		t.Fatalf("sign-in on a read-only console: %d, cookies %v", a.code, a.resp.Cookies())
	}
	a := do(t, c, "POST", e.srv.URL+"/console/replay", url.Values{"mode": {"ids"}, "id": {strconv.FormatInt(id, 10)}, "confirm": {"1"}})
	if a.code != http.StatusForbidden || e.state(t, id) != "dead_letter" || e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`) != 0 {
		t.Fatalf("replay on a read-only console: %d, state %s", a.code, e.state(t, id))
	}
}

// TestResolveRules: as `reconcile resolve`, a resolve is checked against
// GitHub, so without GitHub it is refused (and audited) unless forced;
// supersede needs a reason.
func TestResolveRules(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	rec := e.reconciliationRecord(t, controlplane.QueueOutbox)
	c := e.client(t)
	csrf := e.signIn(t, c, "bob")
	base := e.srv.URL + "/console/reconcile/" + strconv.FormatInt(rec, 10)
	page := do(t, c, "GET", e.srv.URL+"/console/effects/"+strconv.FormatInt(rec, 10), nil)
	if page.code != 200 || !strings.Contains(page.body, `id="resolve"`) || !strings.Contains(page.body, "acme/api release run 12 attempt 34 (#1)") {
		t.Fatalf("record page: %d %s", page.code, page.body)
	}
	if a := do(t, c, "POST", base+"/supersede", url.Values{"csrf": {csrf}, "reason": {"  "}}); a.code != http.StatusBadRequest {
		t.Fatalf("supersede without a reason: %d", a.code)
	}
	if a := do(t, c, "POST", base+"/resolve", url.Values{"csrf": {csrf}, "workflow_run_id": {"0"}}); a.code != http.StatusBadRequest {
		t.Fatalf("resolve with run 0: %d", a.code)
	}
	a := do(t, c, "POST", base+"/resolve", url.Values{"csrf": {csrf}, "workflow_run_id": {"777"}})
	if a.code != http.StatusConflict || !strings.Contains(a.body, "force") || e.state(t, rec) != "reconciliation_required" {
		t.Fatalf("unforced resolve without GitHub: %d, state %s: %s", a.code, e.state(t, rec), a.body)
	}
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.console_audit WHERE action = 'resolve' AND changed = 0 AND outcome LIKE 'refused:%'`); n != 1 {
		t.Fatalf("%d refused-resolve audit rows, want 1", n)
	}
	a = do(t, c, "POST", base+"/resolve", url.Values{"csrf": {csrf}, "workflow_run_id": {"777"}, "force": {"1"}})
	if a.code != 200 || e.state(t, rec) != "completed" {
		t.Fatalf("forced resolve: %d, state %s: %s", a.code, e.state(t, rec), a.body)
	}
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.console_audit WHERE operator = 'bob' AND action = 'resolve' AND changed = 1`); n != 1 {
		t.Fatalf("%d resolve audit rows, want 1", n)
	}
}

// TestEffectsListAndDetail: the filters narrow the list, paging walks it by
// id, and the detail page redacts credential values of the payload.
func TestEffectsListAndDetail(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key)
		SELECT 'bulk', 'bulk.type', 'bulk-' || g, CASE WHEN g <= 3 THEN 'acct-1' END FROM generate_series(1, 7) g`)
	id := e.deadLetter(t, "projection", "rec-42", "solr: update: HTTP 401: require authentication",
		`{"record_id": "r42", "nested": {"api_key": "sk-live-123", "title": "ok"}, "password": "hunter2"}`)
	c := e.client(t)
	e.signIn(t, c, "alice")
	rowRE := regexp.MustCompile(`<tr data-id="(\d+)">`)
	ids := func(body string) []string {
		var out []string
		for _, m := range rowRE.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for q, want := range map[string]int{
		"":                          8,
		"?queue=bulk":               7,
		"?state=dead_letter":        1,
		"?type=test.effect":         1,
		"?key=rec-":                 1,
		"?key=ec-":                  0,
		"?error=http+401":           1,
		"?queue=bulk&state=leased":  0,
		"?queue=projection&key=rec": 1,
		// The ordering key is matched exactly, with or without a state
		// (a state other than completed reads effects_ordering_idx).
		"?ordering_key=acct-1":                 3,
		"?ordering_key=acct":                   0,
		"?ordering_key=acct-1&state=available": 3,
		"?ordering_key=acct-1&state=completed": 0,
		"?ordering_key=acct-1&queue=other":     0,
	} {
		a := do(t, c, "GET", e.srv.URL+"/console/effects"+q, nil)
		if got := len(ids(a.body)); a.code != 200 || got != want {
			t.Errorf("effects%s: %d, %d rows, want %d", q, a.code, got, want)
		}
	}
	if a := do(t, c, "GET", e.srv.URL+"/console/effects?state=nope", nil); a.code != http.StatusBadRequest {
		t.Errorf("unknown state: %d", a.code)
	}
	// Paging: 3 per page, newest first, no row twice, none missed.
	var seen []string
	next := "/console/effects?limit=3"
	for next != "" {
		a := do(t, c, "GET", e.srv.URL+next, nil)
		seen = append(seen, ids(a.body)...)
		m := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(a.body)
		next = ""
		if m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if len(seen) != 8 || seen[0] != strconv.FormatInt(id, 10) {
		t.Fatalf("paged ids %v: want all 8, newest (%d) first", seen, id)
	}
	// The next page keeps the ordering-key filter.
	if a := do(t, c, "GET", e.srv.URL+"/console/effects?ordering_key=acct-1&limit=2", nil); !strings.Contains(a.body, "ordering_key=acct-1") {
		t.Fatalf("next page of an ordering key lost the filter: %s", a.body)
	}
	var ordered int64
	if err := e.pool.QueryRow(e.ctx, `SELECT min(id) FROM pgoutbox.effects WHERE ordering_key = 'acct-1'`).Scan(&ordered); err != nil {
		t.Fatal(err)
	}
	if a := do(t, c, "GET", e.srv.URL+"/console/effects/"+strconv.FormatInt(ordered, 10), nil); !strings.Contains(a.body, `<dd id="ordering-key">acct-1</dd>`) {
		t.Fatalf("effect page does not show the ordering key: %s", a.body)
	}
	a := do(t, c, "GET", e.srv.URL+"/console/effects/"+strconv.FormatInt(id, 10), nil)
	if a.code != 200 || strings.Contains(a.body, "sk-live-123") || strings.Contains(a.body, "hunter2") ||
		!strings.Contains(a.body, `&#34;title&#34;: &#34;ok&#34;`) || !strings.Contains(a.body, "record r42") ||
		!strings.Contains(a.body, `id="replay-button"`) || !strings.Contains(a.body, `<dd id="ordering-key">-</dd>`) {
		t.Fatalf("detail page: %d %s", a.code, a.body)
	}
	if a := do(t, c, "GET", e.srv.URL+"/console/effects/999999", nil); a.code != http.StatusNotFound {
		t.Fatalf("missing effect: %d", a.code)
	}
}

func TestRedactPayload(t *testing.T) {
	got := console.RedactPayload([]byte(`{"token": "t", "list": [{"clientSecret": "s"}, 3], "author": "a", "APIKey": 7}`))
	for _, leak := range []string{`"t"`, `"s"`, "7"} {
		if strings.Contains(got, leak) {
			t.Errorf("redacted payload shows %s:\n%s", leak, got)
		}
	}
	if !strings.Contains(got, `"author": "a"`) || strings.Count(got, console.Redacted) != 3 {
		t.Errorf("redacted payload:\n%s", got)
	}
	if got := console.RedactPayload([]byte(`not json`)); strings.Contains(got, "not json") {
		t.Errorf("non-JSON payload shown: %s", got)
	}
}

// TestOverview: each queue's counts, and its last hour drawn from the
// persisted samples: the busiest minute reaches the top of the throughput
// chart at that minute's place.
func TestOverview(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	e.deadLetter(t, "q1", "k1", "boom", `{}`)
	e.sample(t, "q1", 30, 60, 4)
	e.sample(t, "q1", 10, 120, 9)
	e.sample(t, "q1", 90, 6000, 99) // older than the window: not drawn
	c := e.client(t)
	a := do(t, c, "GET", e.srv.URL+"/console/", nil)
	if a.code != 200 || !strings.Contains(a.body, `<tr data-queue="q1">`) ||
		!strings.Contains(a.body, `<a href="/console/dead-letters?queue=q1">1</a>`) {
		t.Fatalf("overview: %d %s", a.code, a.body)
	}
	// 10 minutes ago is bucket 49 of 0..59: x = 49·600/59 = 498.3; 120
	// completions in a minute are 2/s, the maximum, so y = 0.
	if !strings.Contains(a.body, "max 2.00") || !strings.Contains(a.body, "498.3,0.0") || !strings.Contains(a.body, "max 9)") {
		t.Fatalf("charts: %s", a.body)
	}
}

// TestSessionExpires: a session is worth nothing after SessionTTL, on the
// console's clock; reads then go back to the sign-in and actions are
// refused.
func TestSessionExpires(t *testing.T) {
	t.Parallel()
	e, advance := newClockedEnv(t, console.Config{OperatorToken: token, SessionTTL: time.Hour})
	cl := e.client(t)
	csrf := e.signIn(t, cl, "alice")
	advance(time.Hour)
	if a := do(t, cl, "GET", e.srv.URL+"/console/effects", nil); a.code != http.StatusSeeOther {
		t.Fatalf("read after the TTL: %d, want a redirect to the sign-in", a.code)
	}
	if a := do(t, cl, "POST", e.srv.URL+"/console/signout", url.Values{"csrf": {csrf}}); a.code != http.StatusForbidden {
		t.Fatalf("action after the TTL: %d, want 403", a.code)
	}
}

func joinIDs(ids []int64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}
