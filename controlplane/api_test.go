package controlplane_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

func (b *bundle) startRun(t *testing.T, token, body string) (int, controlplane.StartedRun) {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodPost, b.srv.URL+"/api/release-runs", strings.NewReader(body))
	must(t, err)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var s controlplane.StartedRun
	_ = json.NewDecoder(resp.Body).Decode(&s)
	return resp.StatusCode, s
}

func TestStartReleaseRunByHand(t *testing.T) {
	t.Parallel()
	b, emu := withGitHub(t, controlplane.Config{APIToken: "api-token-canary"}, fakegh.Options{})
	b.startWorkers(t)
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})
	good := `{"repository":"` + repoName + `","ref":"v9.9.9","head_sha":"` + sha1 + `"}`
	bad := []struct {
		token, body string
		want        int
	}{
		{"", good, 401},
		{"wrong", good, 401},
		{"api-token-canary", `{"repository":"` + repoName + `","ref":"v1"}`, 400},
		{"api-token-canary", `{"repository":"` + repoName + `","ref":"v1","head_sha":"xyz"}`, 400},
		{"api-token-canary", `not json`, 400},
		{"api-token-canary", `{"repository":"acme/nope","ref":"v1","head_sha":"` + sha1 + `"}`, 404},
	}
	for _, tc := range bad {
		before := b.counts(t)
		if code, _ := b.startRun(t, tc.token, tc.body); code != tc.want {
			t.Errorf("%q with token %q: %d, want %d", tc.body, tc.token, code, tc.want)
		}
		if after := b.counts(t); after != before {
			t.Errorf("%q: bad request wrote something", tc.body)
		}
	}
	code, s := b.startRun(t, "api-token-canary", good)
	if code != http.StatusCreated || s.ReleaseRunID == 0 || s.AttemptNumber != 1 {
		t.Fatalf("start: %d %+v", code, s)
	}
	b.waitEmu(t, emu, "check run and dispatch", func(s fakegh.Snapshot) bool { return len(s.CheckRuns) == 1 && len(s.Dispatches) == 1 })
	if d := emu.Dispatches()[0]; d.Ref != "refs/tags/v9.9.9" || d.Inputs["release_run_id"] != itoa(s.ReleaseRunID) {
		t.Fatalf("dispatch %+v", d)
	}
	if code, again := b.startRun(t, "api-token-canary", good); code != http.StatusOK || !again.Existing || again.ReleaseRunID != s.ReleaseRunID {
		t.Fatalf("repeat: %d %+v, want 200 with the existing run", code, again)
	}
	// Unconfigured: 503 "not configured".
	b2 := setup(t, nil, controlplane.Config{})
	if code, _ := b2.startRun(t, "anything", good); code != http.StatusServiceUnavailable {
		t.Fatalf("without PGOUTBOX_API_TOKEN: %d, want 503", code)
	}
}

func TestReplayFunctionSkipsReconciliationRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	must(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(b.ctx, tx, []pgoutbox.Effect{
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "dead-1"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunCreate, Key: "dead-2"},
			{Queue: controlplane.QueueOutbox, Type: controlplane.TypeWorkflowDispatch, Key: "recon"},
			{Queue: "other_queue", Type: "x", Key: "dead-elsewhere"},
		})
		return err
	}))
	_, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET attempts = 8,
		state = CASE WHEN idempotency_key = 'recon' THEN 'reconciliation_required' ELSE 'dead_letter' END::pgoutbox.effect_state,
		delivery_started_at = CASE WHEN idempotency_key = 'recon' THEN now() END`)
	must(t, err)
	var n int64
	must(t, b.pool.QueryRow(b.ctx, `SELECT boardreadyops_replay_control_plane_outbox(100)`).Scan(&n))
	if n != 2 {
		t.Fatalf("replayed %d, want the 2 dead letters of control_plane_outbox", n)
	}
	if got := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available' AND attempts = 0 AND queue = $1`, controlplane.QueueOutbox); got != 2 {
		t.Fatalf("%d replayed with fresh attempts", got)
	}
	if got := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE idempotency_key = 'recon' AND state = 'reconciliation_required'`); got != 1 {
		t.Fatal("the reconciliation record was touched")
	}
	if got := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'other_queue' AND state = 'dead_letter'`); got != 1 {
		t.Fatal("another queue's dead letter was replayed")
	}
	// resolve and supersede refuse anything that is not a reconciliation record.
	var deadID int64
	must(t, b.pool.QueryRow(b.ctx, `SELECT id FROM pgoutbox.effects WHERE queue = 'other_queue'`).Scan(&deadID))
	if err := b.app.Resolve(b.ctx, deadID, 1); !errors.Is(err, controlplane.ErrNotFound) {
		t.Fatalf("resolve of a dead letter: %v", err)
	}
	if _, err := b.app.Supersede(b.ctx, deadID, "x"); !errors.Is(err, controlplane.ErrNotFound) {
		t.Fatalf("supersede of a dead letter: %v", err)
	}
}

func TestPrimaryRateLimitWaitsForReset(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	reset := time.Now().Add(3 * time.Second).Truncate(time.Second).Add(time.Second)
	emu.SetRateLimit(installationID, 0, reset)
	_, err := emu.Push(b.ctx, repoName, "refs/tags/v8.0.0", sha1)
	must(t, err)
	b.waitEmu(t, emu, "check run created", func(s fakegh.Snapshot) bool { return len(s.CheckRuns) == 1 })
	// Each call that met the limit waited for the reset: no route was
	// refused twice, and nothing succeeded before the reset.
	refused := map[string]int{}
	for _, c := range emu.Calls() {
		if c.Status == http.StatusForbidden {
			refused[c.Route]++
			if refused[c.Route] > 1 {
				t.Fatalf("%s was retried before the reset and refused again", c.Route)
			}
		}
		if c.Status/100 == 2 && c.Route != fakegh.RouteCreateInstallationToken && c.At.Before(reset) {
			t.Fatalf("%s succeeded at %s, before the reset at %s", c.Route, c.At, reset)
		}
	}
	if len(refused) == 0 {
		t.Fatal("no call was rate limited")
	}
	var buf bytes.Buffer
	buf.WriteString(b.logText())
	if !strings.Contains(buf.String(), "retry_after") {
		t.Fatal("the rate limit was not classified as retry-after")
	}
}
