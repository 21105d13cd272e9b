package projection_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/projection"
)

const cronSecret = "cron-secret-value"

// claimed counts effects that any claim touched.
func (b *bundle) claimed(t *testing.T) int64 {
	t.Helper()
	return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE attempts > 0 OR state <> 'available'`)
}

func (b *bundle) cron(t *testing.T, auth string) (int, projection.CronResponse, http.Header) {
	t.Helper()
	code, out, hdr := b.do(t, http.MethodGet, "/api/cron/outbox", "", nil, "Authorization", auth)
	var resp projection.CronResponse
	if code == 200 {
		resp = decode[projection.CronResponse](t, out)
	}
	return code, resp, hdr
}

func TestCronAuthAndDisabled(t *testing.T) {
	t.Parallel()
	b, _ := setupSolr(t, projection.Config{CronSecret: cronSecret})
	b.importN(t, 3, "Cron")
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + cronSecret + "x", "Basic " + cronSecret, cronSecret} {
		code, _, hdr := b.cron(t, auth)
		if code != http.StatusUnauthorized || !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("auth %q: %d %v", auth, code, hdr)
		}
	}
	// Right secret, METAMUSEUM_OUTBOX_CRON_ENABLED unset: safe, disabled.
	code, resp, _ := b.cron(t, "Bearer "+cronSecret)
	if code != 200 || resp.Status != "disabled" || !strings.Contains(resp.Reason, "METAMUSEUM_OUTBOX_CRON_ENABLED") || resp.Claimed != 0 {
		t.Fatalf("disabled: %d %+v", code, resp)
	}
	if n := b.claimed(t); n != 0 {
		t.Fatalf("%d effects claimed by refused or disabled calls", n)
	}

	// Enabled, but no target on: still nothing claimed.
	noTarget := setup(t, projection.Config{CronSecret: cronSecret, CronEnabled: true})
	noTarget.importN(t, 2, "NoTarget")
	code, resp, _ = noTarget.cron(t, "Bearer "+cronSecret)
	if code != 200 || resp.Status != "disabled" || !strings.Contains(resp.Reason, "no projection target") {
		t.Fatalf("no target: %d %+v", code, resp)
	}
	if n := noTarget.claimed(t); n != 0 {
		t.Fatalf("%d effects claimed with no target", n)
	}
	if _, err := noTarget.app.RunBatch(noTarget.ctx, 10); !errors.Is(err, projection.ErrNoTarget) || noTarget.claimed(t) != 0 {
		t.Fatalf("projector with no target: %v", err)
	}
	if noTarget.app.Queues() != nil || noTarget.app.EffectTypes() != nil {
		t.Fatal("no target, yet a queue or type to register")
	}

	// Unset secret: nothing can authenticate; 401, nothing claimed.
	unset, _ := setupSolr(t, projection.Config{CronEnabled: true})
	unset.importN(t, 1, "Unset")
	for _, auth := range []string{"", "Bearer ", "Bearer x"} {
		if code, _, _ := unset.cron(t, auth); code != http.StatusUnauthorized {
			t.Fatalf("unset secret, auth %q: %d", auth, code)
		}
	}
	if n := unset.claimed(t); n != 0 {
		t.Fatalf("%d claimed with CRON_SECRET unset", n)
	}
}

func TestCronRunsOneBoundedCycle(t *testing.T) {
	t.Parallel()
	b, s := setupSolr(t, projection.Config{CronSecret: cronSecret, CronEnabled: true, CronLimit: 3})
	b.importN(t, 5, "Cron")
	code, resp, _ := b.cron(t, "Bearer "+cronSecret)
	if code != 200 || resp.Status != "ran" || resp.Claimed != 3 || resp.Projected != 3 || resp.Remaining != 2 || resp.Limit != 3 {
		t.Fatalf("first cycle: %d %+v", code, resp)
	}
	if s.Count(solrCore) != 3 {
		t.Fatalf("Solr holds %d documents after one cycle of 3", s.Count(solrCore))
	}
	code, resp, _ = b.cron(t, "Bearer "+cronSecret)
	if code != 200 || resp.Projected != 2 || resp.Remaining != 0 {
		t.Fatalf("second cycle: %d %+v", code, resp)
	}
	code, resp, _ = b.cron(t, "Bearer "+cronSecret)
	if code != 200 || resp.Status != "ran" || resp.Claimed != 0 {
		t.Fatalf("empty cycle: %d %+v", code, resp)
	}
}

func TestWorkersPage(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{
		CronSecret: cronSecret,
		Disabled:   map[string]string{projection.TargetSolr: "OUTBOX_PROJECT_TO_SOLR is not 1"},
	})
	b.importN(t, 4, "SecretTitle")
	// One dead letter with a last error, one retrying effect, one leased.
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 3, time.Minute)
	if err != nil || len(leases) != 3 {
		t.Fatal(err)
	}
	if _, err := leases[0].Fail(b.ctx, b.pool, pgoutbox.Permanent(errors.New("solr: update: HTTP 400: bad field")), true, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := leases[1].Fail(b.ctx, b.pool, pgoutbox.Retry(errors.New("HTTP 503")), true, time.Minute); err != nil {
		t.Fatal(err)
	}
	// Another queue's history: one completion three hours ago (retained,
	// outside the window: /workers must not read it) and one just now.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, state, created_at, completed_at)
		VALUES ('history', 't', 'old', 'completed', now() - interval '3 hours', now() - interval '3 hours'),
		       ('history', 't', 'new', 'completed', now() - interval '2 seconds', now())`); err != nil {
		t.Fatal(err)
	}
	code, out, _ := b.do(t, http.MethodGet, "/workers?format=json", "", nil)
	if code != 200 {
		t.Fatalf("json: %d %s", code, out)
	}
	rep := decode[projection.WorkersReport](t, out)
	var history *projection.QueueReport
	for i := range rep.Queues {
		if rep.Queues[i].Queue == "history" {
			history = &rep.Queues[i]
		}
	}
	if history == nil || history.States["completed"] != 1 || history.CompletedLastMinute != 1 || history.MeanLagSeconds < 1 {
		t.Fatalf("completed within the window: %+v", history)
	}
	var q *projection.QueueReport
	for i := range rep.Queues {
		if rep.Queues[i].Queue == projection.Queue {
			q = &rep.Queues[i]
		}
	}
	if q == nil || q.States["available"] != 2 || q.States["leased"] != 1 || q.States["dead_letter"] != 1 || q.Retrying != 1 {
		t.Fatalf("backlog: %+v", q)
	}
	if rep.Projection.Records != 4 || rep.Projection.LagSeconds <= 0 {
		t.Fatalf("projection: %+v", rep.Projection)
	}
	if len(rep.Attention) != 1 || !strings.Contains(rep.Attention[0].LastError, "HTTP 400") {
		t.Fatalf("attention: %+v", rep.Attention)
	}
	if rep.Projection.Targets[0].Enabled || rep.Projection.Targets[0].Reason != "OUTBOX_PROJECT_TO_SOLR is not 1" {
		t.Fatalf("targets: %+v", rep.Projection.Targets)
	}
	if rep.Projection.NextDrain.At != nil || !strings.Contains(rep.Projection.NextDrain.Why, "no projection target") {
		t.Fatalf("next drain: %+v", rep.Projection.NextDrain)
	}
	if !rep.Projection.Cron.NextWakeUp.After(rep.GeneratedAt) || rep.Projection.Cron.NextWakeUp.Minute()%5 != 0 {
		t.Fatalf("next cron wake-up %v", rep.Projection.Cron.NextWakeUp)
	}
	code, html, hdr := b.do(t, http.MethodGet, "/workers", "", nil)
	if code != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") {
		t.Fatalf("html: %d %v", code, hdr)
	}
	page := string(html)
	for _, want := range []string{`data-queue="outbox_events"`, `data-state="available">2<`, `data-state="dead_letter">1<`,
		"HTTP 400: bad field", "OUTBOX_PROJECT_TO_SOLR is not 1", "pending → available", "setTimeout(refresh"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Never payloads or secrets.
	for _, body := range []string{page, string(out)} {
		for _, secret := range []string{"SecretTitle", cronSecret, token, "record_id"} {
			if strings.Contains(body, secret) {
				t.Errorf("the workers page shows %q", secret)
			}
		}
	}
}
