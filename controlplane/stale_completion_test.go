package controlplane_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// TestOldCheckRunCompletionDoesNotOverwriteTheNewer: attempt 1's Check Run
// completion dead-letters, a Re-run's attempt 2 concludes the other way and
// its completion is applied; replaying the dead letters (the runbook's
// step) then changes nothing at GitHub, success → failure and failure →
// success alike.
func TestOldCheckRunCompletionDoesNotOverwriteTheNewer(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ old, newer string }{{"success", "failure"}, {"failure", "success"}} {
		t.Run(c.old+" then "+c.newer, func(t *testing.T) {
			t.Parallel()
			b, emu := installed(t, fakegh.Options{})
			snap := b.pushRelease(t, emu, "refs/tags/v1.0.0")
			run1 := snap.Dispatches[0].RunID
			b.waitDispatched(t, run1)
			emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteUpdateCheckRun, Kind: fakegh.FaultStatus, Status: 422, Times: 1})
			_, err := emu.CompleteRun(b.ctx, run1, c.old)
			must(t, err)
			b.waitFor(t, "attempt 1's completion dead-lettered", func() bool {
				return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE effect_type = $1 AND state = 'dead_letter'`,
					controlplane.TypeCheckRunComplete) == 1
			})

			_, err = emu.RerequestCheckRun(b.ctx, snap.CheckRuns[0].ID)
			must(t, err)
			snap = b.waitEmu(t, emu, "second dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 2 })
			run2 := snap.Dispatches[1].RunID
			b.waitDispatched(t, run2)
			_, err = emu.CompleteRun(b.ctx, run2, c.newer)
			must(t, err)
			b.waitEmu(t, emu, "check run concluded "+c.newer, func(s fakegh.Snapshot) bool { return s.CheckRuns[0].Conclusion == c.newer })
			b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
			updates := func() int {
				n := 0
				for _, call := range emu.Calls() {
					if call.Route == fakegh.RouteUpdateCheckRun {
						n++
					}
				}
				return n
			}
			before := updates()

			if n := b.scalar(t, `SELECT boardreadyops_replay_control_plane_outbox(100)`); n != 1 {
				t.Fatalf("replayed %d dead letters, want 1", n)
			}
			b.waitFor(t, "the replayed completion finished", func() bool {
				return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE effect_type = $1 AND state IN ('available', 'leased')`,
					controlplane.TypeCheckRunComplete) == 0
			})
			if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE effect_type = $1 AND state <> 'completed'`,
				controlplane.TypeCheckRunComplete); n != 0 {
				t.Fatalf("%d Check Run completions not completed: an older attempt's completion is skipped, not refused", n)
			}
			if cr := emu.CheckRuns()[0]; cr.Conclusion != c.newer {
				t.Fatalf("after the replay the Check Run says %s; the latest attempt concluded %s", cr.Conclusion, c.newer)
			}
			if after := updates(); after != before {
				t.Fatalf("the replayed old completion called GitHub (%d → %d Check Run updates)", before, after)
			}
			if n := b.scalar(t, `SELECT count(*) FROM control_plane.release_runs WHERE conclusion = $1`, c.newer); n != 1 {
				t.Fatal("the release run lost its latest conclusion")
			}
		})
	}
}

// TestCheckRunCompletionMustAgreeWithTheDatabase: a completion enqueued by
// hand for the running latest attempt, saying success, is refused (a dead
// letter, nothing sent): the handler applies the conclusion the database
// recorded, never the payload's alone.
func TestCheckRunCompletionMustAgreeWithTheDatabase(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	b.pushRelease(t, emu, "refs/tags/v1.0.0")
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	runID := b.scalar(t, `SELECT id FROM control_plane.release_runs`)
	attempt := b.scalar(t, `SELECT id FROM control_plane.execution_attempts`)
	var id int64
	must(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: controlplane.QueueOutbox, Type: controlplane.TypeCheckRunComplete,
			Key: "forged", OrderingKey: "release_run:" + itoa(runID), Payload: controlplane.CheckRunComplete{
				ReleaseRunID: runID, ExecutionAttemptID: attempt, InstallationID: installationID, Repository: repoName, Conclusion: "success"}})
		return err
	}))
	b.waitFor(t, "the forged completion finished", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state IN ('completed', 'dead_letter')`, id) == 1
	})
	if cr := emu.CheckRuns()[0]; cr.Status != "in_progress" || cr.Conclusion != "" {
		t.Fatalf("the Check Run is %s/%s while the release runs", cr.Status, cr.Conclusion)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'dead_letter' AND last_error LIKE '%nothing sent%'`, id); n != 1 {
		t.Fatal("the forged completion is not a dead letter that says why")
	}
}
