package controlplane_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// heldDispatch lets a test hold one workflow dispatch after GitHub
// accepted it and before its answer reaches the control plane.
type heldDispatch struct {
	controlplane.GitHub
	mu      sync.Mutex
	armed   bool
	sent    chan int64
	release chan struct{}
}

func newHeldDispatch(gh controlplane.GitHub) *heldDispatch {
	return &heldDispatch{GitHub: gh, sent: make(chan int64, 1), release: make(chan struct{})}
}

// arm makes the next dispatch wait, once GitHub answered, for release.
func (h *heldDispatch) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed = true
}

func (h *heldDispatch) DispatchWorkflow(ctx context.Context, installationID int64, repo, workflow, ref string, inputs map[string]string) (github.DispatchResult, error) {
	res, err := h.GitHub.DispatchWorkflow(ctx, installationID, repo, workflow, ref, inputs)
	h.mu.Lock()
	hold := h.armed
	h.armed = false
	h.mu.Unlock()
	if hold {
		h.sent <- res.WorkflowRunID
		select {
		case <-h.release:
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	return res, err
}

// TestQuickReRunsDoNotStrandTheRun: two Re-runs in a row, by two users (the
// same user's second click on an unchanged Check Run sends the same body,
// which the endpoint refuses as a replay). The first one's dispatch is sent
// and held before its answer is recorded; the second Re-run supersedes that
// attempt meanwhile. The sent dispatch completes (its run id
// recorded on the superseded attempt), nothing goes to
// reconciliation_required, the newest attempt's dispatch follows at once,
// and the superseded run's completion concludes nothing.
func TestQuickReRunsDoNotStrandTheRun(t *testing.T) {
	t.Parallel()
	var held *heldDispatch
	b, emu := installedWrapped(t, fakegh.Options{}, func(gh controlplane.GitHub) controlplane.GitHub {
		held = newHeldDispatch(gh)
		return held
	})
	snap := b.pushRelease(t, emu, "refs/tags/v1.0.0")
	b.waitDispatched(t, snap.Dispatches[0].RunID)
	cr := snap.CheckRuns[0].ID

	held.arm()
	_, err := emu.RerequestCheckRun(b.ctx, cr)
	must(t, err)
	var run2 int64
	select {
	case run2 = <-held.sent:
	case <-b.ctx.Done():
		t.Fatal("attempt 2's dispatch was never sent")
	}
	attempt2 := b.scalar(t, `SELECT id FROM control_plane.execution_attempts WHERE attempt_number = 2`)
	_, err = emu.RerequestCheckRunAs(b.ctx, cr, "second-maintainer", 1003)
	must(t, err)
	b.waitFor(t, "attempt 3 created, attempt 2 superseded", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE attempt_number = 3`) == 1 &&
			b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE id = $1 AND state = 'superseded'`, attempt2) == 1
	})
	close(held.release)

	key := pgoutbox.Key(controlplane.TypeWorkflowDispatch, itoa(attempt2))
	var state string
	b.waitFor(t, "attempt 2's dispatch settled", func() bool {
		must(t, b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effects WHERE idempotency_key = $1`, key).Scan(&state))
		return state != "leased" && state != "available"
	})
	if state != "completed" {
		t.Fatalf("attempt 2's sent dispatch is %s, want completed (it was sent: its outcome is known)", state)
	}
	snap = b.waitEmu(t, emu, "attempt 3 dispatched", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 3 })
	run3 := snap.Dispatches[2].RunID
	b.waitFor(t, "attempt 3 dispatched", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE attempt_number = 3 AND state = 'dispatched' AND workflow_run_id = $1`, run3) == 1
	})
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE id = $1 AND state = 'superseded' AND workflow_run_id = $2`, attempt2, run2); n != 1 {
		t.Fatal("the superseded attempt does not record the run its dispatch created")
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'reconciliation_required'`); n != 0 {
		t.Fatalf("%d effects in reconciliation_required", n)
	}

	// The superseded run's completion concludes nothing; the newest does.
	d, err := emu.CompleteRun(b.ctx, run2, "failure")
	must(t, err)
	if outcome := b.inboxOutcome(t, d.ID); !strings.Contains(outcome, "already superseded") {
		t.Fatalf("the superseded run's completion: %q", outcome)
	}
	_, err = emu.CompleteRun(b.ctx, run3, "success")
	must(t, err)
	b.waitEmu(t, emu, "check run concluded", func(s fakegh.Snapshot) bool { return s.CheckRuns[0].Conclusion == "success" })
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`); n != 0 {
		t.Fatalf("%d effects not completed", n)
	}
}
