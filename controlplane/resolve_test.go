package controlplane_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// TestResolveChecksTheRunOnGitHub: reconcile resolve accepted any run id
// (issue 17, point 6). Against the GitHub emulator, a run that does not
// exist, a run of another repository, a run of the same workflow for
// another attempt, and a run of another workflow that carries the
// attempt's name are each refused with ErrRunMismatch and change nothing;
// a GitHub outage is an error that is not a verdict and changes nothing;
// the dispatch's own run is accepted and recorded as verified.
func TestResolveChecksTheRunOnGitHub(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	id := b.unknownDispatch(t, emu, fakegh.FaultLoseResponse, "refs/tags/v3.0.0")
	pending, err := b.app.ListPending(b.ctx, 10)
	must(t, err)
	if len(pending) != 1 || pending[0].ID != id {
		t.Fatalf("pending: %+v", pending)
	}
	d := pending[0].Dispatch
	own := emu.Dispatches()[0].RunID

	// Another attempt's run in the same repository and workflow, and a run
	// in the other repository: two more pushes, dispatched normally.
	_, err = emu.Push(b.ctx, repoName, "refs/tags/v3.1.0", "2222222222222222222222222222222222222222")
	must(t, err)
	_, err = emu.Push(b.ctx, otherRepoName, "refs/tags/v1.0.0", "3333333333333333333333333333333333333333")
	must(t, err)
	b.waitEmu(t, emu, "three dispatches", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 3 })
	var otherAttempt, otherRepo int64
	for _, x := range emu.Dispatches()[1:] {
		if x.Repository == repoName {
			otherAttempt = x.RunID
		} else {
			otherRepo = x.RunID
		}
	}
	// A run of another workflow that carries this attempt's name.
	_, err = emu.AddWorkflow(repoName, fakegh.Workflow{Name: "Other", Path: ".github/workflows/other.yml", RunName: fakegh.ReleaseRunName})
	must(t, err)
	httpClient := &http.Client{Timeout: 10 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, emu.URL(), emu.AppID(), emu.AppPrivateKey(), nil)
	must(t, err)
	gh := github.NewClient(httpClient, emu.URL(), tokens)
	res, err := gh.DispatchWorkflow(b.ctx, installationID, repoName, "other.yml", "refs/heads/main", map[string]string{
		"release_run_id": strconv.FormatInt(d.ReleaseRunID, 10), "execution_attempt_id": strconv.FormatInt(d.ExecutionAttemptID, 10)})
	must(t, err)
	otherWorkflow := res.WorkflowRunID

	before := b.resolveDigest(t, id, d.ExecutionAttemptID)
	for _, c := range []struct {
		name string
		run  int64
		want string
	}{
		{"no such run", own + 1_000_000, "GitHub has no workflow run"},
		{"a run of another repository", otherRepo, "GitHub has no workflow run"},
		{"another attempt's run", otherAttempt, "is named"},
		{"a run of another workflow", otherWorkflow, "is a run of .github/workflows/other.yml, not of release.yml"},
	} {
		err := b.app.Resolve(b.ctx, id, c.run)
		if !errors.Is(err, controlplane.ErrRunMismatch) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s (run %d): %v, want ErrRunMismatch saying %q", c.name, c.run, err, c.want)
		}
		if after := b.resolveDigest(t, id, d.ExecutionAttemptID); after != before {
			t.Fatalf("%s: a refused resolve changed the record or the attempt", c.name)
		}
	}
	// GitHub unreachable for the check: an error, not a verdict; nothing changes.
	emu.InjectFault(fakegh.FaultRule{Route: fakegh.RouteGetWorkflowRun, Kind: fakegh.FaultStatus, Status: 502, Times: 1})
	if err := b.app.Resolve(b.ctx, id, own); err == nil || errors.Is(err, controlplane.ErrRunMismatch) ||
		!strings.Contains(err.Error(), "could not verify workflow run") {
		t.Fatalf("resolve during an outage: %v", err)
	}
	if after := b.resolveDigest(t, id, d.ExecutionAttemptID); after != before {
		t.Fatal("a resolve that could not verify changed something")
	}
	// The dispatch's own run is accepted.
	must(t, b.app.Resolve(b.ctx, id, own))
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed' AND (resolution->>'verified')::boolean
		AND (resolution->>'workflow_run_id')::bigint = $2`, id, own); n != 1 {
		t.Fatal("the record is not completed with a verified resolution")
	}
}

// TestResolveWithoutGitHub: without a GitHub client Resolve refuses
// (ErrNoGitHub) after checking the record, and ResolveUnverified (--force)
// resolves, recording "verified": false.
func TestResolveWithoutGitHub(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	var id int64
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, attempts, delivery_started_at, reconciliation_at)
		VALUES ('control_plane_outbox', 'github.workflow.dispatch', 'k1',
		        '{"release_run_id": 1, "execution_attempt_id": 2, "repository": "acme/api", "workflow": "release.yml", "ref": "refs/tags/v1"}',
		        'reconciliation_required', 1, now(), now()) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	before := b.resolveDigest(t, id, 2)
	if err := b.app.Resolve(b.ctx, id+1, 5); !errors.Is(err, controlplane.ErrNotFound) {
		t.Fatalf("resolve of a missing record: %v, want ErrNotFound", err)
	}
	if err := b.app.Resolve(b.ctx, id, 5); !errors.Is(err, controlplane.ErrNoGitHub) {
		t.Fatalf("resolve without GitHub: %v, want ErrNoGitHub", err)
	}
	if err := b.app.ResolveUnverified(b.ctx, id, 0); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("run id 0: %v", err)
	}
	if after := b.resolveDigest(t, id, 2); after != before {
		t.Fatal("a refused resolve changed something")
	}
	must(t, b.app.ResolveUnverified(b.ctx, id, 5))
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'
		AND NOT (resolution->>'verified')::boolean`, id); n != 1 {
		t.Fatal("--force did not resolve with verified = false")
	}
}

// resolveDigest is the reconciliation record and its execution attempt
// (the rows a resolve writes), to prove a refused resolve changed nothing;
// the workers go on with the other pushes meanwhile.
func (b *bundle) resolveDigest(t *testing.T, id, attemptID int64) string {
	t.Helper()
	var s string
	must(t, b.pool.QueryRow(b.ctx, `SELECT coalesce((SELECT md5(to_jsonb(e)::text) FROM pgoutbox.effects e WHERE id = $1), '-')
		|| coalesce((SELECT md5(to_jsonb(a)::text) FROM control_plane.execution_attempts a WHERE id = $2), '-')`, id, attemptID).Scan(&s))
	return s
}
