package controlplane_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

const sha2 = "2222222222222222222222222222222222222222"

// workflowRunCompleted is a workflow_run completed payload as GitHub sends
// it, with only the fields the control plane reads.
func workflowRunCompleted(repoID int64, repoName string, runID int64, path, event, title, sha string) map[string]any {
	return map[string]any{
		"action": "completed",
		"workflow_run": map[string]any{
			"id": runID, "name": "CI", "path": path, "display_title": title, "head_sha": sha, "head_branch": "main",
			"event": event, "status": "completed", "conclusion": "success", "run_attempt": 1, "run_number": 1,
		},
		"repository":   map[string]any{"id": repoID, "full_name": repoName},
		"installation": map[string]any{"id": installationID},
	}
}

// inboxOutcome waits until the delivery's inbox row is processed and
// returns its outcome.
func (b *bundle) inboxOutcome(t *testing.T, deliveryID string) string {
	t.Helper()
	var outcome string
	b.waitFor(t, "inbox row "+deliveryID+" processed", func() bool {
		err := b.pool.QueryRow(b.ctx, `SELECT coalesce(outcome, '') FROM control_plane.webhook_inbox
			WHERE delivery_id = $1 AND status <> 'received'`, deliveryID).Scan(&outcome)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err == nil
	})
	return outcome
}

// TestForeignWorkflowRunDoesNotConcludeTheRelease: the dispatch's answer is
// lost, so the attempt has no workflow_run_id and its completion is matched
// by run name. A pull request's CI run, a run of another workflow, a run of
// the release workflow on another commit and a run in another repository,
// each named "release R attempt A", conclude nothing; inspect points only
// at the real run and resolve refuses the others; the real run concludes
// the release.
func TestForeignWorkflowRunDoesNotConcludeTheRelease(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	id := b.unknownDispatch(t, emu, fakegh.FaultLoseResponse, "refs/tags/v1.0.0")
	runID := b.scalar(t, `SELECT id FROM control_plane.release_runs`)
	attempt := b.scalar(t, `SELECT id FROM control_plane.execution_attempts`)
	title := controlplane.RunName(runID, attempt)
	real := emu.Dispatches()[0].RunID

	foreign := []struct {
		name string
		body map[string]any
	}{
		{"a pull request's CI run", workflowRunCompleted(repoID, repoName, 990001, ".github/workflows/ci.yml", "pull_request", title, sha1)},
		{"a dispatched run of another workflow", workflowRunCompleted(repoID, repoName, 990002, ".github/workflows/other.yml", "workflow_dispatch", title, sha1)},
		{"a pushed run of the release workflow", workflowRunCompleted(repoID, repoName, 990003, ".github/workflows/release.yml", "push", title, sha1)},
		{"the release workflow on another commit", workflowRunCompleted(repoID, repoName, 990004, ".github/workflows/release.yml", "workflow_dispatch", title, sha2)},
		{"the release workflow in another repository", workflowRunCompleted(otherRepoID, otherRepoName, 990005, ".github/workflows/release.yml", "workflow_dispatch", title, sha1)},
	}
	for _, f := range foreign {
		d, err := emu.DeliverWebhook(b.ctx, "workflow_run", f.body)
		must(t, err)
		outcome := b.inboxOutcome(t, d.ID)
		if n := b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE state <> 'dispatching' OR conclusion IS NOT NULL`); n != 0 {
			t.Fatalf("%s concluded the release (%s)", f.name, outcome)
		}
		if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE effect_type = $1`, controlplane.TypeCheckRunComplete); n != 0 {
			t.Fatalf("%s enqueued a Check Run completion (%s)", f.name, outcome)
		}
	}

	// A run of the release workflow, dispatched with the attempt's inputs,
	// on another commit: listed by inspect, never pointed at, refused by
	// resolve.
	_, err := emu.Push(b.ctx, repoName, "refs/heads/feature", sha2)
	must(t, err)
	httpClient := &http.Client{Timeout: 10 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, emu.URL(), emu.AppID(), emu.AppPrivateKey(), nil)
	must(t, err)
	gh := github.NewClient(httpClient, emu.URL(), tokens)
	res, err := gh.DispatchWorkflow(b.ctx, installationID, repoName, controlplane.WorkflowDefault, "refs/heads/feature", map[string]string{
		"release_run_id": strconv.FormatInt(runID, 10), "execution_attempt_id": strconv.FormatInt(attempt, 10)})
	must(t, err)
	in, err := b.app.Inspect(b.ctx, id)
	must(t, err)
	var listed bool
	for _, c := range in.Candidates {
		if c.WorkflowRunID == res.WorkflowRunID {
			listed = true
		}
		if c.Matches != (c.WorkflowRunID == real) {
			t.Errorf("inspect: candidate %d (%q) matches=%v; only the real run %d may match", c.WorkflowRunID, c.DisplayTitle, c.Matches, real)
		}
	}
	if !listed || !strings.Contains(in.Suggestion, "--workflow-run-id "+itoa(real)) {
		t.Fatalf("inspect listed the other commit's run: %v; suggestion %q", listed, in.Suggestion)
	}
	if err := b.app.Resolve(b.ctx, id, res.WorkflowRunID); !errors.Is(err, controlplane.ErrRunMismatch) || !strings.Contains(err.Error(), sha2) {
		t.Fatalf("resolve with the other commit's run: %v, want ErrRunMismatch naming %s", err, sha2)
	}

	// The real run concludes the release, and after resolve the Check Run.
	d, err := emu.CompleteRun(b.ctx, real, "failure")
	must(t, err)
	if outcome := b.inboxOutcome(t, d.ID); !strings.Contains(outcome, "concluded failure (matched by run name)") {
		t.Fatalf("the real run: %q", outcome)
	}
	must(t, b.app.Resolve(b.ctx, id, real))
	b.waitEmu(t, emu, "check run concluded", func(s fakegh.Snapshot) bool {
		return len(s.CheckRuns) == 1 && s.CheckRuns[0].Conclusion == "failure"
	})
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs WHERE conclusion = 'failure'`); n != 1 {
		t.Fatal("the release run is not concluded by its own run")
	}
}
