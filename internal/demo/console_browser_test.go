package demo_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox/internal/browsertest"
	"github.com/pgoutbox/pgoutbox/internal/demo"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestConsoleHandlesTheDemoIncidents handles both incidents the demo leaves
// in headless Chromium, through the operator console: the dead-lettered
// record is found by its error and replayed (count confirmed), and the
// reconciliation record shows its candidate run from the GitHub emulator
// and is resolved with it, checked against GitHub; both are in the audit.
func TestConsoleHandlesTheDemoIncidents(t *testing.T) {
	t.Parallel()
	browsertest.Exec(t) // fail before the demo runs when there is no browser
	const token = "demo-operator-token-81c3"
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	d, err := demo.Start(ctx, demo.Options{Pool: pool, Records: 50, OperatorToken: token})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = d.Close(context.WithoutCancel(ctx)) }()
	s, err := d.Story(ctx)
	if err != nil || s.ReconcileID == 0 {
		t.Fatalf("story: %v (reconcile id %d)", err, s.ReconcileID)
	}
	var dead int64
	if err := pool.QueryRow(ctx, `SELECT id FROM pgoutbox.effects WHERE state = 'dead_letter'`).Scan(&dead); err != nil {
		t.Fatalf("the demo's dead letter: %v", err)
	}
	state := func(id int64) string {
		var st string
		if err := pool.QueryRow(ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	bctx := browsertest.New(t, ctx, 1400, 900)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}

	run("sign in", chromedp.Navigate(d.URL()+"/console/"),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.SendKeys(chromedp.CSS(`input[name="operator"]`), "on-call"),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#queues")),
		chromedp.Navigate(d.URL()+"/console/effects"),
		chromedp.WaitVisible(chromedp.CSS("#effects")))

	// The dead-lettered record: found by its error text, replayed.
	deadRow := `#effects tr[data-id="` + strconv.FormatInt(dead, 10) + `"]`
	run("filter", chromedp.SendKeys(chromedp.CSS(`#filters input[name="error"]`), "year_i"),
		// Wait for the filtered page itself (its form echoes the filter):
		// the unfiltered list may show the same row, and a click on it
		// would race the filter's navigation.
		chromedp.Click(chromedp.CSS("#apply")),
		chromedp.WaitVisible(chromedp.CSS(`#filters input[name="error"][value="year_i"]`)),
		chromedp.WaitVisible(chromedp.CSS(deadRow)),
		chromedp.Click(chromedp.CSS(deadRow+" a")), chromedp.WaitVisible(chromedp.CSS("#replay-button")))
	if st := text("#state"); st != "dead_letter" || !strings.Contains(text("#subject"), "-poison") {
		t.Fatalf("dead letter page: state %q subject %q", st, text("#subject"))
	}
	run("replay", chromedp.Click(chromedp.CSS("#replay-button")), chromedp.WaitVisible(chromedp.CSS("#confirm-button")),
		chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#replayed")))
	if got := text("#message"); got != "Replayed 1 of 1 confirmed." || !strings.Contains(text("#replayed"), "available") {
		t.Fatalf("replay: %q / %q", got, text("#replayed"))
	}

	// The reconciliation record: the emulator's run is the candidate that
	// matches; resolving with it is checked on GitHub.
	recURL := d.URL() + "/console/effects/" + strconv.FormatInt(s.ReconcileID, 10)
	run("open the record", chromedp.Navigate(recURL), chromedp.WaitVisible(chromedp.CSS("#candidates")))
	if os.Getenv("PGOUTBOX_UPDATE_SCREENSHOTS") == "1" { // the picture of docs/console.md
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("..", "..", "docs", "console", "reconciliation-candidates.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runID := text("#candidates tr.ok td:nth-child(2)")
	if _, err := strconv.ParseInt(runID, 10, 64); err != nil {
		t.Fatalf("no matching candidate run: %q (candidates %q)", runID, text("#candidates"))
	}
	run("resolve", chromedp.SendKeys(chromedp.CSS(`#resolve input[name="workflow_run_id"]`), runID),
		chromedp.Submit(chromedp.CSS("#resolve")), chromedp.WaitVisible(chromedp.CSS("#message")))
	if got := text("#message"); !strings.Contains(got, "checked against GitHub") || state(s.ReconcileID) != "completed" {
		t.Fatalf("resolve: %q, state %s", got, state(s.ReconcileID))
	}
	run("audit", chromedp.Navigate(d.URL()+"/console/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	if got := text("#audit tbody"); !strings.Contains(got, "on-call") || !strings.Contains(got, "replay") ||
		!strings.Contains(got, "resolved (checked against GitHub)") {
		t.Fatalf("audit: %q", got)
	}
}
