package console_test

import (
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/server"
)

// TestSignInRateLimit: after SignInFailuresMax wrong tokens from one
// address, every sign-in from it — the right token included — answers 429
// with Retry-After (the seconds left of the window, on the console's
// clock) and sets no cookie; when the window ends the right token works.
func TestSignInRateLimit(t *testing.T) {
	t.Parallel()
	e, advance := newClockedEnv(t, console.Config{OperatorToken: token, SignInFailuresMax: 3, SignInWindow: time.Minute})
	cl := e.client(t)
	signin := func(tok string) answer {
		return do(t, cl, "POST", e.srv.URL+"/console/signin", url.Values{"token": {tok}, "operator": {"eve"}})
	}
	for i := range 3 {
		if a := signin("wrong"); a.code != http.StatusForbidden {
			t.Fatalf("wrong token %d: %d, want 403", i+1, a.code)
		}
		advance(10 * time.Second)
	}
	// 30 s of the 60 s window are gone.
	for _, tok := range []string{"wrong", token} {
		a := signin(tok)
		if a.code != http.StatusTooManyRequests || a.resp.Header.Get("Retry-After") != "30" || len(a.resp.Cookies()) != 0 ||
			!strings.Contains(a.body, "try again in 30 s") {
			t.Fatalf("sign-in (%s) past the limit: %d, Retry-After %q, cookies %v: %s", tok, a.code,
				a.resp.Header.Get("Retry-After"), a.resp.Cookies(), a.body)
		}
	}
	advance(30 * time.Second)
	if a := signin(token); a.code != http.StatusSeeOther || len(a.resp.Cookies()) != 1 {
		t.Fatalf("right token after the window: %d, cookies %v", a.code, a.resp.Cookies())
	}
}

// TestCrossOriginPostsRefused: a POST whose Origin (or, without one, its
// Referer) names another host is answered 403 before anything happens —
// sign-in, replay, resolve, sign-out alike, even with a valid session and
// CSRF token — and no effect, audit row or session changes; the same POST
// from the console's own origin works.
func TestCrossOriginPostsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	dead := e.deadLetter(t, "q1", "k1", "boom", `{}`)
	rec := e.reconciliationRecord(t, "q1")
	c := e.client(t)
	csrf := e.signIn(t, c, "alice")
	self := e.srv.URL // http://127.0.0.1:port

	post := func(path string, form url.Values, headers map[string]string) answer {
		t.Helper()
		req, err := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return answer{code: resp.StatusCode, resp: resp}
	}
	snapshot := func() string {
		return strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`)) + "/" +
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'reconciliation_required'`)) + "/" +
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`))
	}
	replay := url.Values{"csrf": {csrf}, "mode": {"ids"}, "id": {strconv.FormatInt(dead, 10)}, "confirm": {"1"}}
	resolve := url.Values{"csrf": {csrf}, "workflow_run_id": {"99"}, "force": {"1"}}
	before := snapshot()
	for _, h := range []map[string]string{
		{"Origin": "http://evil.example"},
		{"Origin": "null"},
		{"Referer": "http://evil.example/console/dead-letters"},
		{"Origin": "http://evil.example", "Referer": self + "/console/dead-letters"},
	} {
		for path, form := range map[string]url.Values{
			"/console/replay": replay,
			"/console/reconcile/" + strconv.FormatInt(rec, 10) + "/resolve": resolve,
			"/console/signin":  {"token": {token}, "operator": {"mallory"}},
			"/console/signout": {"csrf": {csrf}},
		} {
			if a := post(path, form, h); a.code != http.StatusForbidden || len(a.resp.Cookies()) != 0 {
				t.Errorf("%s with %v: %d (cookies %v), want 403 and no cookie", path, h, a.code, a.resp.Cookies())
			}
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("cross-origin POSTs changed something: dead letters/records/audit rows %s → %s", before, after)
	}
	// The session survived the refused sign-out, and the same replay from
	// the console's own origin works.
	if a := post("/console/replay", replay, map[string]string{"Origin": self}); a.code != http.StatusOK || e.state(t, dead) != "available" {
		t.Fatalf("same-origin replay: %d, state %s", a.code, e.state(t, dead))
	}
	if !strings.Contains(e.logs.String(), "cross-origin") {
		t.Fatal("no log line for the refused cross-origin POSTs")
	}
}

// barrierBody is a request body whose first Read waits until every
// request of the batch has started reading its body.
type barrierBody struct {
	r       io.Reader
	once    sync.Once
	arrived *sync.WaitGroup
	release <-chan struct{}
}

func (b *barrierBody) Read(p []byte) (int, error) {
	b.once.Do(func() { b.arrived.Done(); <-b.release })
	return b.r.Read(p)
}

// limitedConsole is a console alone, served in-process (handler calls, no
// listener), with the sign-in limit max per window on a clock of its own.
func limitedConsole(t *testing.T, max int) (h http.Handler, advance func(time.Duration)) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c, err := console.New(console.Config{Pool: pool, OperatorToken: token, SignInFailuresMax: max, SignInWindow: time.Minute,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	return c.Handler(), func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
}

// concurrently serves n requests from one address, released together once
// every goroutine is ready, and returns their answers.
func concurrently(h http.Handler, n int, req func(i int) *http.Request) []*httptest.ResponseRecorder {
	out := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		r, w := req(i), httptest.NewRecorder()
		out[i] = w
		wg.Go(func() {
			<-start
			h.ServeHTTP(w, r)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// byCode counts answers by status code, and those with Retry-After.
func byCode(ws []*httptest.ResponseRecorder) (codes map[int]int, retryAfter int) {
	codes = map[int]int{}
	for _, w := range ws {
		codes[w.Code]++
		if w.Header().Get("Retry-After") != "" {
			retryAfter++
		}
	}
	return codes, retryAfter
}

// TestSignInLimitCountsBeforeComparing: 40 wrong tokens sent at once from
// one address, all of them past the limit check before any is compared in
// the old order, get at most SignInFailuresMax (5) comparisons: 5 answer
// 403, the other 35 answer 429 without being compared.
func TestSignInLimitCountsBeforeComparing(t *testing.T) {
	t.Parallel()
	h, _ := limitedConsole(t, 5)
	const n = 40
	var arrived sync.WaitGroup
	arrived.Add(n)
	release := make(chan struct{})
	go func() { arrived.Wait(); close(release) }()
	codes, _ := byCode(concurrently(h, n, func(i int) *http.Request {
		form := url.Values{"token": {"wrong-" + strconv.Itoa(i)}}.Encode()
		r := httptest.NewRequest("POST", "/console/signin", &barrierBody{r: strings.NewReader(form), arrived: &arrived, release: release})
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return r
	}))
	if codes[http.StatusForbidden] != 5 || codes[http.StatusTooManyRequests] != n-5 {
		t.Fatalf("40 concurrent wrong tokens, limit 5: %v, want 5 × 403 (compared) and 35 × 429", codes)
	}
}

// TestBearerGuessesAreLimited: the operator token presented as a bearer
// header on the console's pages goes through the sign-in limit: of 40
// concurrent wrong guesses 5 are compared (401) and 35 refused (429 with
// Retry-After); the right token is then refused too, until the window
// ends.
func TestBearerGuessesAreLimited(t *testing.T) {
	t.Parallel()
	h, advance := limitedConsole(t, 5)
	const n = 40
	get := func(tok string) *http.Request {
		r := httptest.NewRequest("GET", "/console/audit", nil)
		r.Header.Set("Authorization", "Bearer "+tok)
		return r
	}
	codes, retry := byCode(concurrently(h, n, func(i int) *http.Request { return get("wrong-" + strconv.Itoa(i)) }))
	if codes[http.StatusUnauthorized] != 5 || codes[http.StatusTooManyRequests] != n-5 || retry != n-5 {
		t.Fatalf("40 concurrent wrong bearer tokens, limit 5: %v (%d with Retry-After), want 5 × 401 and 35 × 429", codes, retry)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, get(token))
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "60" {
		t.Fatalf("the right token past the limit: %d (Retry-After %q), want 429", w.Code, w.Header().Get("Retry-After"))
	}
	advance(time.Minute)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, get(token))
	if w.Code != http.StatusOK {
		t.Fatalf("the right token after the window: %d, want 200", w.Code)
	}
}

// TestOperatorRoutesShareTheLimit: the server's operator routes compare
// the operator token under the same limiter as the console: of 40
// concurrent wrong bearer tokens on /workers 5 are compared (401) and 35
// refused (429); the console's sign-in from that address is then refused
// too, the right token included.
func TestOperatorRoutesShareTheLimit(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	s := server.NewWithOptions(nil, nil, server.Options{OperatorToken: token})
	s.HandleOperator("GET /workers", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	c, err := console.New(console.Config{Pool: pool, OperatorToken: token, Limiter: s.OperatorLimiter()})
	if err != nil {
		t.Fatal(err)
	}
	s.HandleOperatorSelfAuth(console.Prefix, c.Handler())
	h := s.Handler()
	codes, _ := byCode(concurrently(h, 40, func(i int) *http.Request {
		r := httptest.NewRequest("GET", "/workers", nil)
		r.Header.Set("Authorization", "Bearer wrong-"+strconv.Itoa(i))
		return r
	}))
	if codes[http.StatusUnauthorized] != 5 || codes[http.StatusTooManyRequests] != 35 {
		t.Fatalf("40 concurrent wrong tokens on /workers: %v, want 5 × 401 and 35 × 429", codes)
	}
	r := httptest.NewRequest("POST", "/console/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusTooManyRequests || len(w.Result().Cookies()) != 0 {
		t.Fatalf("console sign-in after the guesses on /workers: %d, want 429", w.Code)
	}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`)

// confirmForm returns the fields of the replay confirmation form on page.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	start := strings.Index(page, `id="confirm-form"`)
	end := strings.Index(page[max(start, 0):], "</form>")
	if start < 0 || end < 0 {
		t.Fatalf("no confirmation form:\n%s", page)
	}
	f := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(page[start:start+end], -1) {
		f.Add(m[1], html.UnescapeString(m[2]))
	}
	return f
}

// TestReplayConfirmsWhatWasShown: the confirmation page lists the dead
// letters that will move (id, key, error), and confirming it replays
// exactly those: an effect that becomes a dead letter after the page was
// shown — with a lower id than those shown, or among the ids selected —
// is not replayed.
func TestReplayConfirmsWhatWasShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	c := e.client(t)
	csrf := e.signIn(t, c, "alice")
	var late int64 // older than the dead letters, dead-lettered after the page
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
		VALUES ('q1', 'test.effect', 'late', '{}') RETURNING id`).Scan(&late); err != nil {
		t.Fatal(err)
	}
	var shown []int64
	for i := range 3 {
		shown = append(shown, e.deadLetter(t, "q1", "key-"+strconv.Itoa(i), "solr: HTTP 40"+strconv.Itoa(i), `{}`))
	}
	a := do(t, c, "POST", e.srv.URL+"/console/replay", url.Values{"csrf": {csrf}, "mode": {"queue"}, "queue": {"q1"}})
	if a.code != 200 {
		t.Fatalf("confirmation page: %d %s", a.code, a.body)
	}
	for i := range 3 {
		if !strings.Contains(a.body, "key-"+strconv.Itoa(i)) || !strings.Contains(a.body, "solr: HTTP 40"+strconv.Itoa(i)) {
			t.Fatalf("the confirmation page does not list dead letter %d's key and error:\n%s", shown[i], a.body)
		}
	}
	form := confirmForm(t, a.body)
	e.exec(t, `UPDATE pgoutbox.effects SET state = 'dead_letter', attempts = 8, dead_lettered_at = now(), last_error = 'late'
		WHERE id = $1`, late)
	if a := do(t, c, "POST", e.srv.URL+"/console/replay", form); a.code != 200 {
		t.Fatalf("confirming: %d %s", a.code, a.body)
	}
	for _, id := range shown {
		if s := e.state(t, id); s != "available" {
			t.Errorf("shown dead letter %d: %s, want available", id, s)
		}
	}
	if s := e.state(t, late); s != "dead_letter" {
		t.Errorf("dead letter %d, arrived after the page was shown: %s, want dead_letter (not replayed)", late, s)
	}

	// By id: an effect selected while it was not a dead letter is shown as
	// skipped, and stays out even if it dead-letters before the confirmation.
	dead := e.deadLetter(t, "q2", "key-dead", "boom", `{}`)
	var busy int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
		VALUES ('q2', 'test.effect', 'busy', '{}') RETURNING id`).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	a = do(t, c, "POST", e.srv.URL+"/console/replay", url.Values{"csrf": {csrf}, "mode": {"ids"},
		"id": {strconv.FormatInt(dead, 10), strconv.FormatInt(busy, 10)}})
	if a.code != 200 || !strings.Contains(a.body, "key-dead") {
		t.Fatalf("confirmation page by id: %d %s", a.code, a.body)
	}
	form = confirmForm(t, a.body)
	e.exec(t, `UPDATE pgoutbox.effects SET state = 'dead_letter', attempts = 8, dead_lettered_at = now(), last_error = 'late'
		WHERE id = $1`, busy)
	if a := do(t, c, "POST", e.srv.URL+"/console/replay", form); a.code != 200 {
		t.Fatalf("confirming by id: %d %s", a.code, a.body)
	}
	if e.state(t, dead) != "available" || e.state(t, busy) != "dead_letter" {
		t.Fatalf("by id: shown %s (want available), selected but not shown %s (want dead_letter)", e.state(t, dead), e.state(t, busy))
	}
}
