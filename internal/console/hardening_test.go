package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/console"
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
