package controlplane_test

import (
	"encoding/pem"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// installed brings the emulator and the control plane to one installed
// repository with the outbox workers running.
func installed(t *testing.T, opts fakegh.Options) (*bundle, *fakegh.Server) {
	t.Helper()
	return installedWrapped(t, opts, nil)
}

// installedWrapped is installed with the GitHub client seen through wrap.
func installedWrapped(t *testing.T, opts fakegh.Options, wrap func(controlplane.GitHub) controlplane.GitHub) (*bundle, *fakegh.Server) {
	t.Helper()
	b, emu := withGitHubWrapped(t, controlplane.Config{}, opts, wrap)
	b.startWorkers(t)
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})
	return b, emu
}

func (b *bundle) effectState(t *testing.T, typ string) (int64, string) {
	t.Helper()
	var id int64
	var state string
	err := b.pool.QueryRow(b.ctx, `SELECT id, state::text FROM pgoutbox.effects WHERE effect_type = $1 ORDER BY id DESC LIMIT 1`, typ).
		Scan(&id, &state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return id, state
}

// pushRelease pushes release tag ref at sha1 and waits until its Check Run
// and its dispatch reached the emulator.
func (b *bundle) pushRelease(t *testing.T, emu *fakegh.Server, ref string) fakegh.Snapshot {
	t.Helper()
	_, err := emu.Push(b.ctx, repoName, ref, sha1)
	must(t, err)
	return b.waitEmu(t, emu, "check run and dispatch", func(s fakegh.Snapshot) bool {
		return len(s.CheckRuns) == 1 && len(s.Dispatches) == 1
	})
}

// waitDispatched waits until an attempt is dispatched with workflow run runID.
func (b *bundle) waitDispatched(t *testing.T, runID int64) {
	t.Helper()
	b.waitFor(t, "workflow_run_id persisted", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = $1 AND state = 'dispatched'`, runID) == 1
	})
}

// unknownDispatch pushes release tag ref with fault kind on its dispatch
// and waits until the dispatch is in reconciliation_required; it returns
// the record's id.
func (b *bundle) unknownDispatch(t *testing.T, emu *fakegh.Server, kind fakegh.FaultKind, ref string) int64 {
	t.Helper()
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Kind: kind, Times: 1})
	_, err := emu.Push(b.ctx, repoName, ref, sha1)
	must(t, err)
	var id int64
	b.waitFor(t, "dispatch in reconciliation_required", func() bool {
		var state string
		id, state = b.effectState(t, controlplane.TypeWorkflowDispatch)
		return state == "reconciliation_required"
	})
	return id
}

func TestLostCheckRunResponseCreatesExactlyOne(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Kind: fakegh.FaultLoseResponse, Times: 1})
	_, err := emu.Push(b.ctx, repoName, "refs/tags/v2.0.0", sha1)
	must(t, err)
	b.waitFor(t, "check run create completed", func() bool {
		_, state := b.effectState(t, controlplane.TypeCheckRunCreate)
		return state == "completed"
	})
	if n := len(emu.CheckRuns()); n != 1 {
		t.Fatalf("%d check runs after a lost response and a retry, want exactly 1", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs WHERE check_run_id = $1`, emu.CheckRuns()[0].ID); n != 1 {
		t.Fatal("the reused check run's id was not persisted")
	}
}

func TestLostDispatchResponseGoesToReconciliationThenResolve(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	id := b.unknownDispatch(t, emu, fakegh.FaultLoseResponse, "refs/tags/v3.0.0")
	if n := len(emu.Dispatches()); n != 1 {
		t.Fatalf("%d dispatches, want exactly 1 (never re-sent blindly)", n)
	}
	pending, err := b.app.ListPending(b.ctx, 10)
	if err != nil || len(pending) != 1 || pending[0].ID != id {
		t.Fatalf("ListPending: %v %v", pending, err)
	}
	before := b.counts(t)
	in, err := b.app.Inspect(b.ctx, id)
	must(t, err)
	run := emu.Dispatches()[0].RunID
	var pointed int64
	for _, c := range in.Candidates {
		if c.Matches {
			pointed = c.WorkflowRunID
		}
	}
	if pointed != run || !strings.Contains(in.Suggestion, "resolve") {
		t.Fatalf("inspect points at %d (%s), want run %d", pointed, in.Suggestion, run)
	}
	if after := b.counts(t); after != before {
		t.Fatal("inspect changed something")
	}
	must(t, b.app.Resolve(b.ctx, id, run))
	if _, state := b.effectState(t, controlplane.TypeWorkflowDispatch); state != "completed" {
		t.Fatalf("dispatch %s after resolve", state)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = $1 AND state = 'dispatched'`, run); n != 1 {
		t.Fatal("resolve did not advance the attempt")
	}
	if err := b.app.Resolve(b.ctx, id, run); !errors.Is(err, controlplane.ErrNotFound) {
		t.Fatalf("second resolve: %v, want ErrNotFound", err)
	}
	// The run's completion now flows as usual.
	_, err = emu.CompleteRun(b.ctx, run, "success")
	must(t, err)
	b.waitEmu(t, emu, "check run concluded", func(s fakegh.Snapshot) bool {
		return len(s.CheckRuns) == 1 && s.CheckRuns[0].Conclusion == "success"
	})
}

func TestUnsentDispatchIsSupersededOnce(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	id := b.unknownDispatch(t, emu, fakegh.FaultResetBeforeProcessing, "refs/tags/v4.0.0")
	in, err := b.app.Inspect(b.ctx, id)
	must(t, err)
	for _, c := range in.Candidates {
		if c.Matches {
			t.Fatalf("inspect matched %+v but the emulator has no run", c)
		}
	}
	s, err := b.app.Supersede(b.ctx, id, "no run exists")
	must(t, err)
	if s.AttemptNumber != 2 {
		t.Fatalf("superseded into attempt number %d, want 2", s.AttemptNumber)
	}
	snap := b.waitEmu(t, emu, "attempt 2 dispatched", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 1 })
	if got := snap.Dispatches[0].Inputs["execution_attempt_id"]; got != itoa(s.ExecutionAttemptID) {
		t.Fatalf("dispatched attempt %s, want %d", got, s.ExecutionAttemptID)
	}
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := len(emu.Dispatches()); n != 1 {
		t.Fatalf("%d dispatches after supersede, want exactly 1", n)
	}
	if _, err := b.app.Supersede(b.ctx, id, "again"); !errors.Is(err, controlplane.ErrNotFound) {
		t.Fatalf("second supersede: %v", err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE state = 'superseded'`); n != 1 {
		t.Fatalf("%d superseded attempts, want 1", n)
	}
}

func TestRateLimitIsHonoured(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteListCheckRunsForRef, Kind: fakegh.FaultSecondaryRateLimit,
		RetryAfter: 2 * time.Second, Times: 1})
	_, err := emu.Push(b.ctx, repoName, "refs/tags/v5.0.0", sha1)
	must(t, err)
	b.waitEmu(t, emu, "check run created", func(s fakegh.Snapshot) bool { return len(s.CheckRuns) == 1 })
	var limited, next time.Time
	for _, c := range emu.Calls() {
		if c.Route != fakegh.RouteListCheckRunsForRef {
			continue
		}
		if c.Fault == fakegh.FaultSecondaryRateLimit {
			limited = c.At
		} else if !limited.IsZero() && next.IsZero() {
			next = c.At
		}
	}
	if limited.IsZero() || next.IsZero() {
		t.Fatal("rate-limited call or its retry not seen")
	}
	if gap := next.Sub(limited); gap < 2*time.Second {
		t.Fatalf("retried %s after a Retry-After: 2, want no earlier than 2s", gap)
	}
}

func TestSlowGitHubDoesNotDelayPlanning(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	emu.SetDelay(time.Hour) // every GitHub call hangs (until the client gives up)
	// And a poisoned effect that always fails.
	must(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunComplete,
			Key: "poison", Payload: map[string]any{"release_run_id": 999999, "installation_id": installationID, "repository": repoName}})
		return err
	}))
	for i, tag := range []string{"v6.0.0", "v6.0.1", "v6.0.2", "v6.0.3", "v6.0.4"} {
		body := pushPayload("refs/tags/"+tag, strings.Repeat(string(rune('a'+i)), 40))
		b.deliver(t, "push", body)
	}
	b.waitFor(t, "five release runs planned", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1 AND effect_type = $2`,
			controlplane.QueueOutbox, controlplane.TypeWorkflowDispatch) == 5
	})
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs`); n != 5 {
		t.Fatalf("%d release runs", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1 AND state = 'completed'`, controlplane.QueueOutbox); n != 0 {
		t.Fatalf("%d GitHub effects completed while GitHub hangs", n)
	}
	emu.SetDelay(0)
}

// pushPayload is a tag push to the installed repository.
func pushPayload(ref, sha string) map[string]any {
	return map[string]any{
		"ref": ref, "before": strings.Repeat("0", 40), "after": sha, "created": true, "deleted": false,
		"repository":   map[string]any{"id": repoID, "full_name": repoName, "name": "api", "owner": map[string]any{"login": "acme"}},
		"installation": map[string]any{"id": installationID},
		"pusher":       map[string]any{"name": "octocat"},
	}
}

func TestNoSecretInTablesOrLogs(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	_, err := emu.Push(b.ctx, repoName, "refs/tags/v7.0.0", sha1)
	must(t, err)
	snap := b.waitEmu(t, emu, "dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 1 })
	_, err = emu.CompleteRun(b.ctx, snap.Dispatches[0].RunID, "success")
	must(t, err)
	b.waitEmu(t, emu, "concluded", func(s fakegh.Snapshot) bool { return s.CheckRuns[0].Conclusion == "success" })
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })

	tokens, err := github.NewTokenSource(http.DefaultClient, emu.URL(), emu.AppID(), emu.AppPrivateKey(), nil)
	must(t, err)
	token, err := tokens.Token(b.ctx, installationID) // a token of the same installation, same format
	must(t, err)
	block, _ := pem.Decode(emu.AppPrivateKeyPEM())
	keyCanary := string(pem.EncodeToMemory(block))[40:80]
	canaries := map[string]string{"webhook secret": secret, "private key": keyCanary, "token prefix": token[:8]}
	var dump string
	must(t, b.pool.QueryRow(b.ctx, `SELECT string_agg(t::text, ' ') FROM (
		SELECT to_jsonb(e)::text AS t FROM pgoutbox.effects e
		UNION ALL SELECT to_jsonb(w)::text FROM control_plane.webhook_inbox w
		UNION ALL SELECT to_jsonb(r)::text FROM control_plane.release_runs r
		UNION ALL SELECT to_jsonb(a)::text FROM control_plane.execution_attempts a
		UNION ALL SELECT to_jsonb(i)::text FROM control_plane.installations i
		UNION ALL SELECT to_jsonb(r)::text FROM control_plane.repositories r) x`).Scan(&dump))
	logs := b.logText()
	for name, c := range canaries {
		if strings.Contains(dump, c) {
			t.Errorf("%s found in a table", name)
		}
		if strings.Contains(logs, c) {
			t.Errorf("%s found in the logs", name)
		}
	}
	if len(dump) < 1000 || len(logs) == 0 {
		t.Fatalf("nothing searched: %d bytes of tables, %d of logs", len(dump), len(logs))
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
