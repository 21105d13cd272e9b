package console_test

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
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// browser drives one headless Chromium window against the console.
type browser struct {
	t    *testing.T
	ctx  context.Context
	e    *env
	w    int
	dirs []string
}

func newBrowser(t *testing.T, e *env, width, height int) *browser {
	t.Helper()
	ctx := browsertest.New(t, e.ctx, width, height)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return &browser{t: t, ctx: ctx, e: e, w: width, dirs: screenshotDirs(t)}
}

func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s (%d px): %v", what, b.w, err)
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s (%d px): %v", sel, b.w, err)
	}
	return strings.TrimSpace(s)
}

// noOverflow fails when the page is wider than the window: a reader would
// have to scroll sideways.
func (b *browser) noOverflow(page string) {
	b.t.Helper()
	over, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](
		`document.documentElement.scrollWidth - document.documentElement.clientWidth`))
	if err != nil {
		b.t.Fatal(err)
	}
	if over > 0 {
		wide, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`[...document.querySelectorAll('main *')]
			.filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth)
			.slice(0, 3).map(e => e.tagName + (e.id ? '#' + e.id : '') + ' ' + Math.round(e.getBoundingClientRect().width) + 'px').join(', ')`))
		b.t.Fatalf("%s at %d px: %d px of horizontal overflow (widest: %s)", page, b.w, over, wide)
	}
}

// shot checks the page for overflow and, when name is set, saves it.
func (b *browser) shot(page, name string) {
	b.t.Helper()
	b.noOverflow(page)
	if name == "" {
		return
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil || len(png) < 1000 {
		b.t.Fatalf("screenshot %s: %d bytes, %v", name, len(png), err)
	}
	for _, d := range b.dirs {
		if err := os.WriteFile(filepath.Join(d, name+".png"), png, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
}

func (b *browser) signIn(operator string) {
	b.t.Helper()
	b.run("sign in", chromedp.Navigate(b.e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.SendKeys(chromedp.CSS(`input[name="operator"]`), operator),
		chromedp.Click(chromedp.CSS("#signin-button")),
		chromedp.WaitVisible(chromedp.CSS("#queues")))
}

// incidents seeds what an on-call engineer meets: a strict dead letter at
// the head of an ordering key with two effects waiting behind it, a
// scheduled effect, a queue ("emails") that holds effects no live worker
// serves, a live worker for the other queues, a long key, and an hour of
// samples. It returns the blocked key's head.
func incidents(t *testing.T, e *env) (head int64) {
	t.Helper()
	long := strings.Repeat("9f86d081884c7d659a2feaa0c55ad015", 2) // a 64-hex key
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key, payload,
		state, attempts, max_attempts, dead_lettered_at, last_error)
		VALUES ('orders', 'order.sync', $1, 'order-7', '{"record_id": "order-7"}', 'dead_letter', 8, 8, now(),
		'crm: update order-7: HTTP 422: field "total" must be positive') RETURNING id`, "order-7:"+long).Scan(&head); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key, payload)
		SELECT 'orders', 'order.sync', 'order-7:v' || g || ':' || $1, 'order-7', '{"record_id": "order-7"}'
		FROM generate_series(2, 3) g`, long)
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, available_at)
		VALUES ('orders', 'order.reminder', 'reminder:' || $1, '{"record_id": "order-9"}', now() + interval '2 hours')`, long)
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, available_at)
		SELECT 'emails', 'email.send', 'welcome:' || g, '{}', now() - make_interval(secs => 480 - g)
		FROM generate_series(1, 7) g`)
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, completed_at)
		SELECT 'orders', 'order.sync', 'done:' || g, '{}', 'completed', now() FROM generate_series(1, 20) g`)
	if err := store.Heartbeat(e.ctx, e.pool, store.WorkerBeat{ID: "worker-a1b2", Host: "app-1", PID: 4242, Version: "v0.1.0",
		Queues: []string{"orders", "outbox_events"}, Concurrency: []int32{16, 8}, InFlight: 3, Interval: time.Hour,
		StartedAt: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for m := range 60 {
		e.sample(t, "orders", m, int64(120+m%9*15), float64(m%13))
	}
	return head
}

// TestIncidentsInBrowser handles in headless Chromium, at 1,024 and 1,400
// px wide, the incidents the console must make obvious: a key blocked by a
// strict dead letter (found from the overview, its head's error read and
// the head cancelled, three clicks), a queue no live worker serves (flagged
// on the overview and the workers page) which the operator pauses and
// resumes, and a scheduled effect shown with its due time. No page may
// scroll sideways; the screenshots are those of docs/console.md.
func TestIncidentsInBrowser(t *testing.T) {
	t.Parallel()
	for _, width := range []int{1024, 1400} {
		t.Run(strconv.Itoa(width), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, token, false)
			head := incidents(t, e)
			b := newBrowser(t, e, width, 900)
			// The docs keep the overview at both widths, the other pages
			// at 1,024 px (the old pages' pictures are TestConsoleInBrowser's).
			suffix := "-" + strconv.Itoa(width)
			name := func(n string) string {
				if width != 1024 {
					return ""
				}
				return n + suffix
			}
			b.signIn("alice")

			// The overview: the unserved queue, the blocked key, the
			// scheduled effect, the named window.
			orders, emails := `#queues tr[data-queue="orders"]`, `#queues tr[data-queue="emails"]`
			if got := b.text(emails); !strings.Contains(got, "no live worker") {
				t.Fatalf("the unserved queue is not flagged: %q", got)
			}
			if got := b.text(orders); strings.Contains(got, "no live worker") || !strings.Contains(got, "1 need an operator") ||
				!strings.Contains(got, "next ") {
				t.Fatalf("orders on the overview: %q", got)
			}
			if got := b.text("#queues thead"); !strings.Contains(got, "Completed in the last 5 min") {
				t.Fatalf("the completions' window is not named: %q", got)
			}
			b.shot("overview", "overview"+suffix)

			// A blocked key: overview → blocked keys → cancel head →
			// confirm.
			b.run("blocked keys", chromedp.Click(chromedp.CSS(orders+` a[href^="/console/blocked-keys"]`)),
				chromedp.WaitVisible(chromedp.CSS("#blocked")))
			row := `#blocked tr[data-head="` + strconv.FormatInt(head, 10) + `"]`
			if got := b.text(row); !strings.Contains(got, "dead letter (strict)") || !strings.Contains(got, `HTTP 422`) {
				t.Fatalf("the blocked key's row: %q", got)
			}
			b.shot("blocked keys", name("blocked-keys"))
			// The waiting effects read as waiting, not plain available.
			b.run("the key's effects", chromedp.Click(chromedp.CSS(row+` td.key a`)), chromedp.WaitVisible(chromedp.CSS("#effects")))
			if got := b.text("#effects tbody"); !strings.Contains(got, "waiting behind its ordering key's head") ||
				!strings.Contains(got, "out of attempts (8/8)") {
				t.Fatalf("the key's effects: %q", got)
			}
			b.shot("effects of a key", "")
			b.run("back to the blocked keys", chromedp.Navigate(e.srv.URL+"/console/blocked-keys?queue=orders"), chromedp.WaitVisible(chromedp.CSS(row)))
			b.run("cancel the head", chromedp.Click(chromedp.CSS(row+` button.cancel-head`)), chromedp.WaitVisible(chromedp.CSS("#confirm-form")))
			if got := b.text("#count"); !strings.Contains(got, "Cancel 1 effect(s)?") {
				t.Fatalf("cancel confirmation: %q", got)
			}
			b.shot("cancel confirmation", name("cancel-confirm"))
			b.run("confirm", chromedp.SendKeys(chromedp.CSS(`#confirm-form input[name="reason"]`), "order-7 was deleted in the CRM"),
				chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#cancelled-list")))
			if st := e.state(t, head); st != "completed" {
				t.Fatalf("the head is %s after the cancel", st)
			}
			// The key's head is now its first waiting effect, which is
			// available: the key moves on.
			if n := e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = (SELECT min(id) FROM pgoutbox.effects
				WHERE ordering_key = 'order-7' AND state <> 'completed') AND state = 'available' AND id > $1`, head); n != 1 {
				t.Fatal("after the cancel the key's first effect not completed is not an available follower")
			}
			b.run("the key is free", chromedp.Navigate(e.srv.URL+"/console/blocked-keys?queue=orders"), chromedp.WaitVisible(chromedp.CSS("#blocked")))
			if got := b.text("#blocked tbody"); strings.Contains(got, "dead letter (strict)") {
				t.Fatalf("the key is still blocked by its dead letter: %q", got)
			}

			// The unserved queue: the workers page says it; pause it,
			// see the pause, resume it.
			b.run("workers", chromedp.Click(chromedp.CSS(`header a[href="/console/workers"]`)), chromedp.WaitVisible(chromedp.CSS("#workers")))
			if got := b.text("#unserved"); !strings.Contains(got, "emails (7 available") {
				t.Fatalf("workers page, unserved: %q", got)
			}
			if got := b.text(`#workers tr[data-worker="worker-a1b2"]`); !strings.Contains(got, "orders (16)") || !strings.Contains(got, "app-1") {
				t.Fatalf("workers page, the live worker: %q", got)
			}
			b.shot("workers", name("workers"))
			b.run("overview", chromedp.Click(chromedp.CSS(`header a[href="/console/"]`)), chromedp.WaitVisible(chromedp.CSS(emails)))
			b.run("pause", chromedp.Click(chromedp.CSS(emails+` button.pause`)), chromedp.WaitVisible(chromedp.CSS("#pause-form")))
			b.shot("pause confirmation", name("pause-confirm"))
			b.run("confirm the pause", chromedp.SendKeys(chromedp.CSS(`#pause-form input[name="reason"]`), "no worker for emails yet"),
				chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#message")))
			if n := e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses WHERE queue = 'emails' AND paused_by = 'alice'`); n != 1 {
				t.Fatalf("emails not paused: %d", n)
			}
			b.run("overview, paused", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS(emails+` button.resume`)))
			if got := b.text(emails); !strings.Contains(got, "paused by alice") {
				t.Fatalf("the overview does not show the pause: %q", got)
			}
			b.run("the paused queue's effects", chromedp.Click(chromedp.CSS(emails+` a[href="/console/effects?queue=emails"]`)),
				chromedp.WaitVisible(chromedp.CSS("#queue-paused")))
			if got := b.text("#queue-paused") + b.text("#queue-unserved"); !strings.Contains(got, "No live worker works queue emails") ||
				!strings.Contains(got, "no worker claims its effects") {
				t.Fatalf("the effects of the paused, unserved queue: %q", got)
			}
			b.run("overview again", chromedp.Navigate(e.srv.URL+"/console/"), chromedp.WaitVisible(chromedp.CSS(emails+` button.resume`)))
			b.shot("overview, paused", "")
			b.run("resume", chromedp.Click(chromedp.CSS(emails+` button.resume`)), chromedp.WaitVisible(chromedp.CSS("#pause-form")),
				chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#message")))
			if n := e.count(t, `SELECT count(*) FROM pgoutbox.queue_pauses`); n != 0 {
				t.Fatalf("emails still paused after the resume: %d", n)
			}

			// The scheduled effect shows its due time; every list page
			// fits the window.
			b.run("scheduled", chromedp.Navigate(e.srv.URL+"/console/effects?queue=orders&state=available"),
				chromedp.WaitVisible(chromedp.CSS("#effects")))
			if got := b.text("#effects tbody"); !strings.Contains(got, "scheduled, due ") {
				t.Fatalf("the scheduled effect: %q", got)
			}
			b.shot("effects", "")
			b.run("the cancelled head", chromedp.Navigate(e.srv.URL+"/console/effects/"+strconv.FormatInt(head, 10)),
				chromedp.WaitVisible(chromedp.CSS("#timeline")))
			if got := b.text("#timeline"); !strings.Contains(got, "cancelled by alice (never delivered): order-7 was deleted in the CRM") {
				t.Fatalf("the head's timeline: %q", got)
			}
			b.shot("effect", "")
			for _, p := range []string{"/console/effects", "/console/dead-letters", "/console/reconciliation", "/console/audit"} {
				b.run(p, chromedp.Navigate(e.srv.URL+p), chromedp.WaitVisible(chromedp.CSS("main")))
				b.shot(p, "")
			}
		})
	}
}
