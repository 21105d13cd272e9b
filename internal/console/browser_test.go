package console_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/browsertest"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// screenshotDirs are where the browser test saves its screenshots:
// $PGOUTBOX_TEST_ARTIFACTS (default artifacts/test, git-ignored), and
// docs/console as well when PGOUTBOX_UPDATE_SCREENSHOTS=1 (the pictures of
// docs/console.md).
func screenshotDirs(t *testing.T) []string {
	t.Helper()
	dir := os.Getenv("PGOUTBOX_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "..", "artifacts", "test", "console")
	}
	dirs := []string{dir}
	if os.Getenv("PGOUTBOX_UPDATE_SCREENSHOTS") == "1" {
		dirs = append(dirs, filepath.Join("..", "..", "docs", "console"))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dirs
}

// TestConsoleInBrowser handles the demo's incidents in headless Chromium:
// sign in, filter the effects down to the failing record, open the dead
// letter, replay it (confirming the count) and see it leave dead_letter;
// open the reconciliation record and resolve it; read both actions in the
// audit. Every page is saved as a screenshot.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, completed_at)
		SELECT 'outbox_events', 'solr.index', 'record:r' || g, jsonb_build_object('record_id', 'r' || g), 'completed', now()
		FROM generate_series(1, 12) g`)
	// The dead letter fails three times through the engine's own
	// statements, so its page shows each attempt.
	var dead int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, max_attempts)
		VALUES ('outbox_events', 'solr.index', 'record:r13', $1, 3) RETURNING id`,
		`{"record_id": "r13", "title": "Browser record", "solr_auth_token": "s3cr3t-value"}`).Scan(&dead); err != nil {
		t.Fatal(err)
	}
	for i, msg := range []string{"solr: update: HTTP 503: service unavailable", "solr: update: HTTP 401: require authentication",
		"solr: update: HTTP 401: require authentication"} {
		cs, err := store.Claim(e.ctx, e.pool, "outbox_events", "worker-"+strconv.Itoa(i+1), 1, time.Minute)
		if err != nil || len(cs) != 1 || cs[0].ID != dead {
			t.Fatalf("claim %d: %v %v", i+1, cs, err)
		}
		if _, _, err := store.Fail(e.ctx, e.pool, store.Fence{ID: dead, Token: cs[0].Token, Type: cs[0].Type}, store.FailRetry, 0, msg); err != nil {
			t.Fatal(err)
		}
	}
	rec := e.reconciliationRecord(t, controlplane.QueueOutbox)
	for m := range 60 {
		e.sample(t, "outbox_events", m, int64(30+m%7*10), float64(m%11))
	}
	dirs := screenshotDirs(t)

	ctx := browsertest.New(t, e.ctx, 1400, 900)
	ctx, tcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer tcancel()

	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	countRows := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#effects tbody tr[data-id]').length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	shot := func(name string) {
		t.Helper()
		(&browser{t: t, ctx: ctx, w: 1400}).noOverflow(name)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
		if err != nil {
			t.Fatal(err)
		}
		if len(png) < 1000 {
			t.Fatalf("screenshot %s: %d bytes", name, len(png))
		}
		for _, d := range dirs {
			if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Sign in: the console sends a browser without a session to the form.
	run("open the console", chromedp.Navigate(e.srv.URL+"/console/effects"), chromedp.WaitVisible(chromedp.CSS("#signin")))
	shot("signin")
	run("sign in",
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.SendKeys(chromedp.CSS(`input[name="operator"]`), "alice"),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#queues")))
	if got, charts := text(`#queues tr[data-queue="outbox_events"]`), text("#charts"); !strings.Contains(got, "outbox_events") ||
		!strings.Contains(charts, "max 1.50") {
		t.Fatalf("overview: queues %q, charts %q", got, charts)
	}
	shot("overview")

	// Live refresh: a queue that appears in the database appears on the
	// open overview, without a reload (the page's own marker survives).
	mark := func() {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
			t.Fatal(err)
		}
	}
	notReloaded := func(where string) {
		t.Helper()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__notReloaded === true`))
		if err != nil || !ok {
			t.Fatalf("%s: the page was reloaded (%v): live refresh must replace parts of it", where, err)
		}
	}
	mark()
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('live_queue', 'live.type', 'live-1')`)
	run("the new queue appears", chromedp.WaitVisible(chromedp.CSS(`#queues tr[data-queue="live_queue"]`)))
	notReloaded("overview")

	run("effects", chromedp.Click(chromedp.CSS(`header a[href="/console/effects"]`)), chromedp.WaitVisible(chromedp.CSS("#effects")))
	if got, rows := text("#operator"), countRows(); got != "alice" || rows != 15 {
		t.Fatalf("after sign-in: operator %q, %d rows, want alice and 15", got, rows)
	}
	shot("effects")

	// On the effects list: pause, add an effect, type into the filter form
	// (not submitted), resume; the new row appears at once, the typed
	// value is still there and the page was not reloaded.
	mark()
	run("pause", chromedp.Click(chromedp.CSS("#live-toggle")), chromedp.WaitVisible(chromedp.CSS(`#live[data-live-state="paused"]`)))
	if got := text("#live-toggle"); got != "Resume live refresh" {
		t.Fatalf("paused toggle says %q", got)
	}
	var liveID int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		VALUES ('live_queue', 'live.type', 'live-2') RETURNING id`).Scan(&liveID); err != nil {
		t.Fatal(err)
	}
	run("type and resume",
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="type"]`), "half-typed"),
		chromedp.Click(chromedp.CSS("#live-toggle")),
		chromedp.WaitVisible(chromedp.CSS(`#effects tr[data-id="`+strconv.FormatInt(liveID, 10)+`"]`)))
	typed, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#filters input[name="type"]').value`))
	if err != nil || typed != "half-typed" {
		t.Fatalf("the filter form lost what was typed: %q %v", typed, err)
	}
	notReloaded("effects")
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#filters input[name="type"]').value = ''`)); err != nil {
		t.Fatal(err)
	}

	// Filter by error text: only the dead letter is left.
	run("filter",
		chromedp.SendKeys(chromedp.CSS(`#filters input[name="error"]`), "HTTP 401"),
		chromedp.Click(chromedp.CSS("#apply")))
	// The dead letter's row is on the unfiltered page too: wait for the
	// filtered page itself (its form carries the filter as an attribute;
	// typing set only the property) before counting its rows.
	run("filtered page", chromedp.WaitVisible(chromedp.CSS(`#filters input[name="error"][value="HTTP 401"]`)))
	run("filtered", chromedp.WaitVisible(chromedp.CSS(`#effects tr[data-id="`+strconv.FormatInt(dead, 10)+`"]`)))
	if rows := countRows(); rows != 1 {
		t.Fatalf("filtered by error text: %d rows, want 1", rows)
	}
	shot("effects-filtered")

	run("dead letters", chromedp.Click(chromedp.CSS(`a[href="/console/dead-letters"]`)),
		chromedp.WaitVisible(chromedp.CSS("#replay-form")))
	shot("dead-letters")

	// Open the dead letter: its payload's token is redacted.
	run("open the dead letter", chromedp.Click(chromedp.CSS(`#effects a[href="/console/effects/`+strconv.FormatInt(dead, 10)+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#detail")))
	if st, payload := text("#state"), text("#payload"); st != "dead_letter" || strings.Contains(payload, "s3cr3t") ||
		!strings.Contains(payload, "[redacted]") || !strings.Contains(text("#subject"), "record r13") {
		t.Fatalf("dead letter page: state %q, payload %q", st, payload)
	}
	if tl := text("#timeline"); !strings.Contains(tl, "attempt 1 failed → retrying") || !strings.Contains(tl, "HTTP 503") ||
		!strings.Contains(tl, "attempt 3 failed → dead_letter") || !strings.Contains(tl, "worker-2") {
		t.Fatalf("timeline: %q", tl)
	}
	shot("effect")

	// Replay it: the console asks to confirm the count first.
	run("replay", chromedp.Click(chromedp.CSS("#replay-button")), chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
	if got := text("#count"); !strings.Contains(got, "Replay 1 dead letter(s)") {
		t.Fatalf("confirmation: %q", got)
	}
	shot("replay-confirm")
	run("confirm", chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#replayed")))
	if got := text("#message"); got != "Replayed 1 of 1 confirmed." {
		t.Fatalf("replay result: %q", got)
	}
	run("reopen", chromedp.Navigate(e.srv.URL+"/console/effects/"+strconv.FormatInt(dead, 10)), chromedp.WaitVisible(chromedp.CSS("#state")))
	if st := text("#state"); st != "available" || e.state(t, dead) != "available" {
		t.Fatalf("after the replay the page shows %q, the database %q; want available", st, e.state(t, dead))
	}
	if tl := text("#timeline"); !strings.Contains(tl, "replayed by alice after 3 attempt(s)") ||
		!strings.Contains(tl, fmt.Sprintf("replay by alice in the console (ids %d)", dead)) {
		t.Fatalf("the timeline does not name who replayed: %q", tl)
	}

	// The reconciliation record: resolve it with a run (forced: no GitHub
	// in this test, so the page says a resolve must be forced).
	run("reconciliation", chromedp.Click(chromedp.CSS(`a[href="/console/reconciliation"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#effects tr[data-id="`+strconv.FormatInt(rec, 10)+`"]`)))
	shot("reconciliation")
	run("open the record", chromedp.Click(chromedp.CSS(`#effects a[href="/console/effects/`+strconv.FormatInt(rec, 10)+`"]`)),
		chromedp.WaitVisible(chromedp.CSS("#resolve")))
	if st := text("#state"); st != "reconciliation_required" || !strings.Contains(text("#reconcile"), "must be forced") {
		t.Fatalf("record page: state %q", st)
	}
	shot("reconciliation-record")
	run("resolve",
		chromedp.SendKeys(chromedp.CSS(`#resolve input[name="workflow_run_id"]`), "4242"),
		chromedp.Click(chromedp.CSS(`#resolve input[name="force"]`)),
		chromedp.Submit(chromedp.CSS(`#resolve`)),
		chromedp.WaitVisible(chromedp.CSS("#message")))
	if got := text("#message"); !strings.Contains(got, "workflow run 4242 recorded") || e.state(t, rec) != "completed" {
		t.Fatalf("resolve: %q, state %s", got, e.state(t, rec))
	}

	run("audit", chromedp.Navigate(e.srv.URL+"/console/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	if got := text("#audit tbody"); !strings.Contains(got, "replay") || !strings.Contains(got, "resolve") || !strings.Contains(got, "alice") {
		t.Fatalf("audit page: %q", got)
	}
	shot("audit")
}
