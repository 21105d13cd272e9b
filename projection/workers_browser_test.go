package projection_test

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

// artifactDir is where browser screenshots go: $PGOUTBOX_TEST_ARTIFACTS, or
// artifacts/test at the repository root (git-ignored).
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PGOUTBOX_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("..", "artifacts", "test")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestWorkersPageInBrowser loads /workers in headless Chromium, reads the
// backlog numbers this test created, watches the page refresh itself after
// the backlog changes, and saves a screenshot.
func TestWorkersPageInBrowser(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{Disabled: map[string]string{projection.TargetSolr: "OUTBOX_PROJECT_TO_SOLR is not 1"}})
	b.importN(t, 7, "Browser")
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 1, time.Minute)
	if err != nil || len(leases) != 1 {
		t.Fatal(err)
	}
	if _, err := leases[0].Fail(b.ctx, b.pool, pgoutbox.Permanent(errors.New("solr: update: HTTP 401: require authentication")), true, time.Minute); err != nil {
		t.Fatal(err)
	}

	ctx := browsertest.New(t, b.ctx, 1400, 1000)
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
		chromedp.Navigate(b.srv.URL+"/workers"),
		chromedp.WaitVisible(chromedp.CSS("#backlog")),
	); err != nil {
		t.Fatal(err)
	}
	available, dead, records, attention := text(cell("available")), text(cell("dead_letter")), text("#records"), text("#attention")
	if available != "6" || dead != "1" || records != "7" || !strings.Contains(attention, "HTTP 401") {
		t.Fatalf("page shows available %q, dead_letter %q, records %q, attention %q", available, dead, records, attention)
	}

	// The page refreshes itself: three more records show up without a reload.
	b.importN(t, 10, "Browser") // r1..r7 unchanged, r8..r10 new
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
		`document.querySelector('`+string(cell("available"))+`').textContent.trim() === "9"`,
		chromedp.WithPollingInterval(200*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the page did not refresh to the new backlog: %v", err)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(artifactDir(t), "workers-page.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if len(png) < 1000 {
		t.Fatalf("screenshot of %d bytes", len(png))
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
