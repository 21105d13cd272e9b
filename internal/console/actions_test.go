package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// TestNewActionsRefused: pause, resume and cancel are refused (403) without
// a session, with a wrong or another session's CSRF token, and from
// another origin, and then change nothing: the counts of dead letters,
// available effects, pauses and audit rows are the same before and after.
// The same POSTs with the session, its token and the console's own origin
// work.
func TestNewActionsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	dead := e.deadLetter(t, "q1", "k1", "boom", `{}`)
	e.exec(t, `INSERT INTO pgoutbox.queue_pauses (queue, paused_by) VALUES ('q2', 'bob')`)
	alice, mallory, anonymous := e.client(t), e.client(t), e.client(t)
	aliceCSRF := e.signIn(t, alice, "alice")
	malloryCSRF := e.signIn(t, mallory, "mallory")
	snapshot := func() string {
		return strings.Join([]string{
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'dead_letter'`)),
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`)),
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses WHERE queue = 'q2'`)),
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses`)),
			strconv.Itoa(e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`)),
		}, "/")
	}
	actions := map[string]url.Values{
		"/console/queues/pause":  {"queue": {"q1"}, "confirm": {"1"}},
		"/console/queues/resume": {"queue": {"q2"}, "confirm": {"1"}},
		"/console/cancel":        {"id": {strconv.FormatInt(dead, 10)}, "confirm": {"1"}},
	}
	with := func(v url.Values, csrf string) url.Values {
		out := url.Values{}
		for k, x := range v {
			out[k] = x
		}
		if csrf != "" {
			out.Set("csrf", csrf)
		}
		return out
	}
	post := func(c *http.Client, path string, form url.Values, origin string) int {
		t.Helper()
		req, err := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	before := snapshot()
	for path, form := range actions {
		for name, tc := range map[string]struct {
			c      *http.Client
			csrf   string
			origin string
		}{
			"no session":           {anonymous, aliceCSRF, ""},
			"no CSRF token":        {alice, "", ""},
			"wrong CSRF token":     {alice, strings.Repeat("0", 64), ""},
			"other session's CSRF": {alice, malloryCSRF, ""},
			"cross-origin":         {alice, aliceCSRF, "http://evil.example"},
		} {
			if code := post(tc.c, path, with(form, tc.csrf), tc.origin); code != http.StatusForbidden {
				t.Errorf("%s, %s: %d, want 403", path, name, code)
			}
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("refused POSTs changed something: dead letters/completed/q2 paused/pauses/audit %s → %s", before, after)
	}
	for path, form := range actions {
		if code := post(alice, path, with(form, aliceCSRF), e.srv.URL); code != http.StatusOK {
			t.Errorf("%s with session, CSRF and own origin: %d", path, code)
		}
	}
	if got, want := snapshot(), "0/1/0/1/3"; got != want {
		t.Fatalf("after the accepted POSTs: %s, want %s (dead letter cancelled, q2 resumed, q1 paused, 3 audit rows)", got, want)
	}
}

// TestPauseResumeAndCancelPages: the first POST of each action shows what
// it will do and changes nothing; the confirmation acts and records who in
// the audit, and the overview shows the pause; a cancel confirms only the
// effects that may be cancelled and says why the others are not.
func TestPauseResumeAndCancelPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	dead := e.deadLetter(t, "emails", "k1", "smtp: 550", `{}`)
	var leased int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, attempts,
		lease_owner, lease_token, leased_at, lease_expires_at) VALUES ('emails', 't', 'k2', 'leased', 1, 'w', gen_random_uuid(),
		now(), now() + interval '1 minute') RETURNING id`).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	c := e.client(t)
	csrf := e.signIn(t, c, "alice")
	a := do(t, c, "POST", e.srv.URL+"/console/queues/pause", url.Values{"csrf": {csrf}, "queue": {"emails"}})
	if a.code != 200 || !strings.Contains(a.body, "Pause queue <b>emails</b>?") || e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses`) != 0 {
		t.Fatalf("pause, first step: %d %s", a.code, a.body)
	}
	a = do(t, c, "POST", e.srv.URL+"/console/queues/pause", url.Values{"csrf": {csrf}, "queue": {"emails"}, "confirm": {"1"},
		"reason": {"smtp relay down"}})
	if a.code != 200 || e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses WHERE queue = 'emails' AND paused_by = 'alice'
		AND reason = 'smtp relay down'`) != 1 {
		t.Fatalf("pause: %d %s", a.code, a.body)
	}
	if ov := do(t, c, "GET", e.srv.URL+"/console/", nil); !strings.Contains(ov.body, "paused by alice") || !strings.Contains(ov.body, "Resume…") {
		t.Fatalf("the overview does not show the pause: %s", ov.body)
	}
	a = do(t, c, "POST", e.srv.URL+"/console/cancel", url.Values{"csrf": {csrf}, "id": {strconv.FormatInt(dead, 10), strconv.FormatInt(leased, 10)}})
	if a.code != 200 || !strings.Contains(a.body, "Cancel <b>1</b> effect(s)?") || !strings.Contains(a.body, "in delivery (leased)") ||
		e.state(t, dead) != "dead_letter" {
		t.Fatalf("cancel, first step: %d %s", a.code, a.body)
	}
	a = do(t, c, "POST", e.srv.URL+"/console/cancel", url.Values{"csrf": {csrf}, "id": {strconv.FormatInt(dead, 10)}, "confirm": {"1"},
		"reason": {"customer deleted"}})
	if a.code != 200 || !strings.Contains(a.body, "Cancelled 1 of 1 confirmed.") || e.state(t, dead) != "completed" || e.state(t, leased) != "leased" {
		t.Fatalf("cancel: %d %s", a.code, a.body)
	}
	if page := do(t, c, "GET", e.srv.URL+"/console/effects/"+strconv.FormatInt(dead, 10), nil); !strings.Contains(page.body,
		"cancelled by alice (never delivered): customer deleted") || !strings.Contains(page.body, `id="state">completed<`) ||
		// The console action itself, from the audit (ops.EffectHistory).
		!strings.Contains(page.body, fmt.Sprintf("cancel by alice in the console (ids %d)", dead)) ||
		!strings.Contains(page.body, "cancelled 1 of 1 confirmed (reason: customer deleted)") {
		t.Fatalf("the cancelled effect's page: %s", page.body)
	}
	a = do(t, c, "POST", e.srv.URL+"/console/queues/resume", url.Values{"csrf": {csrf}, "queue": {"emails"}, "confirm": {"1"}})
	if a.code != 200 || e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses`) != 0 {
		t.Fatalf("resume: %d %s", a.code, a.body)
	}
	audit := do(t, c, "GET", e.srv.URL+"/console/audit", nil).body
	for _, want := range []string{"paused (reason: smtp relay down)", "cancelled 1 of 1 confirmed (reason: customer deleted)", "resumed"} {
		if !strings.Contains(audit, want) {
			t.Errorf("the audit lacks %q", want)
		}
	}
	// Bounds: an empty or over-long queue name, a 501-character reason,
	// more than 1,000 ids: 400, nothing changed.
	before := e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`)
	ids := make([]string, 1001)
	for i := range ids {
		ids[i] = strconv.Itoa(i + 1)
	}
	for path, form := range map[string]url.Values{
		"/console/queues/pause":  {"csrf": {csrf}, "queue": {strings.Repeat("q", 129)}, "confirm": {"1"}},
		"/console/queues/resume": {"csrf": {csrf}, "queue": {""}, "confirm": {"1"}},
		"/console/cancel":        {"csrf": {csrf}, "id": ids, "confirm": {"1001"}},
	} {
		if a := do(t, c, "POST", e.srv.URL+path, form); a.code != http.StatusBadRequest {
			t.Errorf("%s out of bounds: %d", path, a.code)
		}
	}
	if a := do(t, c, "POST", e.srv.URL+"/console/queues/pause", url.Values{"csrf": {csrf}, "queue": {"x"}, "confirm": {"1"},
		"reason": {strings.Repeat("r", 501)}}); a.code != http.StatusBadRequest {
		t.Errorf("a 501-character reason: %d", a.code)
	}
	if e.count(t, `SELECT count(*) FROM pgoutbox.console_audit`) != before || e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses`) != 0 {
		t.Fatal("a refused action changed something")
	}
}
