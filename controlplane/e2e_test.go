package controlplane_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// withGitHub starts the emulator (delivering its webhooks to the control
// plane under test) and mounts the control plane with a real GitHub client.
func withGitHub(t *testing.T, cfg controlplane.Config, opts fakegh.Options) (*bundle, *fakegh.Server) {
	t.Helper()
	return withGitHubWrapped(t, cfg, opts, nil)
}

// withGitHubWrapped is withGitHub with the client seen through wrap (nil:
// as is), for tests that hold or watch calls.
func withGitHubWrapped(t *testing.T, cfg controlplane.Config, opts fakegh.Options, wrap func(controlplane.GitHub) controlplane.GitHub) (*bundle, *fakegh.Server) {
	t.Helper()
	b, mux := newBundle(t)
	opts.WebhookURL = b.srv.URL + "/webhooks/github"
	opts.WebhookSecret = []byte(secret)
	emu := fakegh.New(opts)
	t.Cleanup(emu.Close)
	httpClient := &http.Client{Timeout: 10 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, emu.URL(), emu.AppID(), emu.AppPrivateKey(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var gh controlplane.GitHub = github.NewClient(httpClient, emu.URL(), tokens)
	if wrap != nil {
		gh = wrap(gh)
	}
	b.mount(t, mux, gh, cfg)
	return b, emu
}

const (
	installationID = 7001
	repoID         = 8001
	repoName       = "acme/api"
	otherRepoID    = 8002
	otherRepoName  = "acme/web"
	sha1           = "1111111111111111111111111111111111111111"
)

// install registers the installation and two repositories in the emulator
// and delivers installation created + installation_repositories added.
func install(t *testing.T, b *bundle, emu *fakegh.Server) {
	t.Helper()
	must(t, emu.AddInstallation(installationID, "acme"))
	must(t, emu.AddRepository(installationID, repoID, repoName))
	must(t, emu.AddRepository(installationID, otherRepoID, otherRepoName))
	_, err := emu.DeliverWebhook(b.ctx, "installation", map[string]any{
		"action":       "created",
		"installation": map[string]any{"id": installationID, "account": map[string]any{"login": "acme", "id": 1}},
		"repositories": []any{map[string]any{"id": repoID, "full_name": repoName, "name": "api"}},
		"sender":       map[string]any{"login": "octocat"},
	})
	must(t, err)
	_, err = emu.DeliverWebhook(b.ctx, "installation_repositories", map[string]any{
		"action":               "added",
		"installation":         map[string]any{"id": installationID, "account": map[string]any{"login": "acme"}},
		"repository_selection": "selected",
		"repositories_added":   []any{map[string]any{"id": otherRepoID, "full_name": otherRepoName, "name": "web"}},
		"repositories_removed": []any{},
	})
	must(t, err)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) waitEmu(t *testing.T, emu *fakegh.Server, what string, cond func(fakegh.Snapshot) bool) fakegh.Snapshot {
	t.Helper()
	if err := emu.Wait(b.ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return emu.Snapshot()
}

func TestReleaseLifecycleEndToEnd(t *testing.T) {
	t.Parallel()
	b, emu := withGitHub(t, controlplane.Config{}, fakegh.Options{})
	b.startWorkers(t)
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})

	_, err := emu.Push(b.ctx, repoName, "refs/tags/v1.0.0", sha1)
	must(t, err)
	snap := b.waitEmu(t, emu, "check run and dispatch", func(s fakegh.Snapshot) bool {
		return len(s.CheckRuns) == 1 && len(s.Dispatches) == 1
	})
	runID := b.scalar(t, `SELECT id FROM control_plane.release_runs`)
	cr := snap.CheckRuns[0]
	if cr.ExternalID != strconv.FormatInt(runID, 10) || cr.Status != "in_progress" || cr.Name != controlplane.CheckRunNameDefault || cr.HeadSHA != sha1 {
		t.Fatalf("check run %+v, want in_progress with external_id %d", cr, runID)
	}
	attempt1 := b.scalar(t, `SELECT id FROM control_plane.execution_attempts WHERE attempt_number = 1`)
	d := snap.Dispatches[0]
	if d.Inputs["release_run_id"] != strconv.FormatInt(runID, 10) || d.Inputs["execution_attempt_id"] != strconv.FormatInt(attempt1, 10) || !d.ReturnRunDetails {
		t.Fatalf("dispatch %+v", d)
	}
	b.waitFor(t, "workflow_run_id persisted", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = $1 AND state = 'dispatched'`, d.RunID) == 1
	})

	_, err = emu.CompleteRun(b.ctx, d.RunID, "success")
	must(t, err)
	b.waitEmu(t, emu, "check run concluded", func(s fakegh.Snapshot) bool {
		return s.CheckRuns[0].Status == "completed" && s.CheckRuns[0].Conclusion == "success"
	})
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs WHERE state = 'completed' AND conclusion = 'success'`); n != 1 {
		t.Fatal("release run not concluded")
	}

	// Re-run: attempt 2 is dispatched and concluded.
	_, err = emu.RerequestCheckRun(b.ctx, cr.ID)
	must(t, err)
	snap = b.waitEmu(t, emu, "second dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 2 })
	attempt2 := b.scalar(t, `SELECT id FROM control_plane.execution_attempts WHERE attempt_number = 2`)
	if snap.Dispatches[1].Inputs["execution_attempt_id"] != strconv.FormatInt(attempt2, 10) {
		t.Fatalf("second dispatch %+v", snap.Dispatches[1])
	}
	b.waitFor(t, "attempt 2 dispatched", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE id = $1 AND state = 'dispatched'`, attempt2) == 1
	})
	_, err = emu.CompleteRun(b.ctx, snap.Dispatches[1].RunID, "failure")
	must(t, err)
	b.waitEmu(t, emu, "check run concluded again", func(s fakegh.Snapshot) bool {
		return s.CheckRuns[0].Conclusion == "failure"
	})
	if len(emu.CheckRuns()) != 1 || len(emu.Dispatches()) != 2 {
		t.Fatalf("%d check runs, %d dispatches; want 1 and 2", len(emu.CheckRuns()), len(emu.Dispatches()))
	}
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`); n != 0 {
		t.Fatalf("%d effects not completed", n)
	}
}

func TestEventsForUninstalledRepositoriesChangeNothing(t *testing.T) {
	t.Parallel()
	b, emu := withGitHub(t, controlplane.Config{}, fakegh.Options{})
	b.startWorkers(t, controlplane.QueueJobs)
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})
	must(t, emu.AddRepository(installationID, 8999, "acme/unlisted"))
	_, err := emu.DeliverWebhook(b.ctx, "installation_repositories", map[string]any{
		"action":               "removed",
		"installation":         map[string]any{"id": installationID},
		"repositories_added":   []any{},
		"repositories_removed": []any{map[string]any{"id": otherRepoID, "full_name": otherRepoName}},
	})
	must(t, err)
	b.waitFor(t, "repository removed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE id = $1 AND state = 'removed'`, otherRepoID) == 1
	})
	_, err = emu.Push(b.ctx, otherRepoName, "refs/tags/v1.0.0", sha1)
	must(t, err)
	_, err = emu.Push(b.ctx, "acme/unlisted", "refs/tags/v1.0.0", sha1)
	must(t, err)
	_, err = emu.Push(b.ctx, repoName, "refs/heads/main", sha1) // not a release tag
	must(t, err)
	b.waitFor(t, "jobs done", func() bool { return b.idle(t, controlplane.QueueJobs) })
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs`); n != 0 {
		t.Fatalf("%d release runs for pushes that must be ignored", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1`, controlplane.QueueOutbox); n != 0 {
		t.Fatalf("%d GitHub effects written", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox WHERE event = 'push' AND status = 'ignored'`); n != 3 {
		t.Fatalf("%d pushes recorded as ignored, want 3", n)
	}
}
