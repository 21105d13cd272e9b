package console_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/browsertest"
	"github.com/pgoutbox/pgoutbox/projection"
)

// TestWorkersPageInBrowser loads /workers in headless Chromium, reads the
// backlog numbers this test created, watches the page refresh itself after
// the backlog changes, and saves a screenshot.
func TestWorkersPageInBrowser(t *testing.T) {
	t.Parallel()
	w := newWorkersEnv(t, "", projection.Config{Disabled: map[string]string{projection.TargetSolr: "OUTBOX_PROJECT_TO_SOLR is not 1"}})
	w.importN(t, 7, "Browser")
	leases, err := pgoutbox.ClaimLeases(w.ctx, w.pool, projection.Queue, "t", 1, time.Minute)
	if err != nil || len(leases) != 1 {
		t.Fatal(err)
	}
	if _, err := leases[0].Fail(w.ctx, w.pool, pgoutbox.Permanent(errors.New("solr: update: HTTP 401: require authentication")), true, time.Minute); err != nil {
		t.Fatal(err)
	}

	ctx := browsertest.New(t, w.ctx, 1400, 1000)
	ctx, tcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer tcancel()

	cell := func(state string) chromedp.CSS {
		return chromedp.CSS(`tr[data-queue="outbox_events"] td[data-state="` + state + `"]`)
	}
	text := func(sel chromedp.CSS) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(w.srv.URL+"/workers"),
		chromedp.WaitVisible(chromedp.CSS("#backlog")),
	); err != nil {
		t.Fatal(err)
	}
	available, dead, records, attention := text(cell("available")), text(cell("dead_letter")), text("#records"), text("#attention")
	if available != "6" || dead != "1" || records != "7" || !strings.Contains(attention, "HTTP 401") {
		t.Fatalf("page shows available %q, dead_letter %q, records %q, attention %q", available, dead, records, attention)
	}

	// The page refreshes itself: three more records show up without a reload.
	w.importN(t, 10, "Browser") // r1..r7 unchanged, r8..r10 new
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
		`document.querySelector('`+string(cell("available"))+`').textContent.trim() === "9"`,
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the page did not refresh to the new backlog: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if len(png) < 1000 {
		t.Fatalf("screenshot of %d bytes", len(png))
	}
	path := filepath.Join(screenshotDirs(t)[0], "workers-page.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
