// Package browsertest starts the headless Chromium that the browser tests
// (/workers, the operator console, the demo's incidents) drive through
// chromedp. It is test support: nothing in the binary imports it.
package browsertest

import (
	"context"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// InstallHint installs the browser the tests drive.
const InstallHint = "apt-get update && apt-get install -y chromium"

// Exec finds a Chromium or Chrome binary on PATH; it fails the test (never
// skips it) with InstallHint when there is none.
func Exec(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatalf("no Chromium found (chromium, chromium-browser, google-chrome); install it with: %s", InstallHint)
	return ""
}

// New starts a headless browser with a window of width × height pixels and
// a profile of its own (in a temporary directory), under parent, and
// returns its chromedp context. The browser is closed at the test's
// cleanup.
func New(t testing.TB, parent context.Context, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Exec(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(width, height), chromedp.UserDataDir(t.TempDir()))
	actx, acancel := chromedp.NewExecAllocator(parent, opts...)
	t.Cleanup(acancel)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	return ctx
}
