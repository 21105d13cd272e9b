package controlplane_test

import (
	"testing"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// TestStaleWorkflowRunCompletesTheCheckRunTimedOut: a workflow run GitHub
// concluded "stale" completes the Check Run as "timed_out" (a Check Run may
// not be given "stale"; the emulator answers 422 for it as GitHub does), so
// the completion effect succeeds instead of dead-lettering.
func TestStaleWorkflowRunCompletesTheCheckRunTimedOut(t *testing.T) {
	t.Parallel()
	b, emu := withGitHub(t, controlplane.Config{}, fakegh.Options{})
	b.startWorkers(t)
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})
	runID := b.pushRelease(t, emu, "refs/tags/v2.0.0").Dispatches[0].RunID
	b.waitDispatched(t, runID)
	_, err := emu.CompleteRun(b.ctx, runID, "stale")
	must(t, err)
	b.waitFor(t, "the completion effect finished", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE effect_type = $1 AND state IN ('completed', 'dead_letter')`,
			controlplane.TypeCheckRunComplete) == 1
	})
	if cr := emu.CheckRuns()[0]; cr.Status != "completed" || cr.Conclusion != "timed_out" {
		t.Fatalf("check run %s/%s, want completed/timed_out", cr.Status, cr.Conclusion)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`); n != 0 {
		t.Fatalf("%d effects not completed (a refused conclusion dead-letters)", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs WHERE state = 'completed' AND conclusion = 'stale'`); n != 1 {
		t.Fatal("the release run does not record the workflow run's own conclusion")
	}
}
