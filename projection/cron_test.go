package projection_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

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

	// Unset secret: nothing can authenticate; 503 naming CRON_SECRET,
	// nothing claimed.
	unset, _ := setupSolr(t, projection.Config{CronEnabled: true})
	unset.importN(t, 1, "Unset")
	for _, auth := range []string{"", "Bearer ", "Bearer x"} {
		if code, _, _ := unset.cron(t, auth); code != http.StatusServiceUnavailable {
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
