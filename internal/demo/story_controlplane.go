package demo

import (
	"context"
	"fmt"
	"strings"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// The demo's GitHub installation.
const (
	installationID = 424242
	repoAPI        = "acme/api"
	repoAPIID      = 5001
	repoWeb        = "acme/web"
	repoWebID      = 5002
)

// releaseStory drives the control plane: installation, two tag pushes, two
// Check Runs, two dispatches (the second one's response lost), one workflow
// run completed and its Check Run concluded.
func (d *Demo) releaseStory(ctx context.Context) (reconcileID int64, err error) {
	gh := d.gh
	for _, step := range []error{
		gh.AddInstallation(installationID, "acme"),
		gh.AddRepository(installationID, repoAPIID, repoAPI),
		gh.AddRepository(installationID, repoWebID, repoWeb),
	} {
		if step != nil {
			return 0, step
		}
	}
	// GitHub will process acme/web's dispatch, then lose the response.
	gh.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Path: "/repos/" + repoWeb + "/actions/workflows/*/dispatches",
		Kind: fakegh.FaultLoseResponse, Times: 1})

	d.say("release control plane: installing the GitHub App on %s and %s (signed webhooks → POST /webhooks/github)", repoAPI, repoWeb)
	if _, err := gh.DeliverWebhook(ctx, "installation", map[string]any{
		"action":       "created",
		"installation": map[string]any{"id": installationID, "account": map[string]any{"login": "acme", "id": 1, "type": "Organization"}},
		"repositories": []any{
			map[string]any{"id": repoAPIID, "full_name": repoAPI, "name": "api"},
			map[string]any{"id": repoWebID, "full_name": repoWeb, "name": "web"},
		},
		"sender": map[string]any{"login": "octocat"},
	}); err != nil {
		return 0, fmt.Errorf("installation webhook: %w", err)
	}
	if err := waitFor(ctx, "repositories installed", func() (bool, error) {
		n, err := d.scalar(ctx, `SELECT count(*) FROM control_plane.repositories WHERE installation_id = $1 AND state = 'active'`, installationID)
		return n == 2, err
	}); err != nil {
		return 0, err
	}

	tag := "refs/tags/v1." + d.run + ".0"
	shas := map[string]string{repoAPI: randomHex(20), repoWeb: randomHex(20)}
	for _, repo := range []string{repoAPI, repoWeb} {
		d.say("release control plane: push %s to %s", strings.TrimPrefix(tag, "refs/tags/"), repo)
		if _, err := gh.Push(ctx, repo, tag, shas[repo]); err != nil {
			return 0, fmt.Errorf("push webhook: %w", err)
		}
	}
	if err := gh.Wait(ctx, func(s fakegh.Snapshot) bool { return len(s.CheckRuns) == 2 && len(s.Dispatches) == 2 }); err != nil {
		return 0, fmt.Errorf("waiting for check runs and dispatches: %w", err)
	}
	d.say("release control plane: 2 Check Runs in progress, 2 workflows dispatched (GitHub lost the response to %s's)", repoWeb)

	var apiRun int64
	for _, disp := range gh.Dispatches() {
		if disp.Repository == repoAPI {
			apiRun = disp.RunID
		}
	}
	if err := waitFor(ctx, "workflow_run_id persisted", func() (bool, error) {
		n, err := d.scalar(ctx, `SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = $1`, apiRun)
		return n == 1, err
	}); err != nil {
		return 0, err
	}
	if _, err := gh.CompleteRun(ctx, apiRun, "success"); err != nil {
		return 0, fmt.Errorf("workflow_run webhook: %w", err)
	}
	if err := gh.Wait(ctx, func(s fakegh.Snapshot) bool {
		for _, cr := range s.CheckRuns {
			if cr.Repository == repoAPI && cr.Conclusion == "success" {
				return true
			}
		}
		return false
	}); err != nil {
		return 0, fmt.Errorf("waiting for the check run to conclude: %w", err)
	}
	d.say("release control plane: %s's workflow run %d succeeded; its Check Run is concluded", repoAPI, apiRun)

	err = waitFor(ctx, "the lost dispatch in reconciliation_required", func() (bool, error) {
		var err error
		reconcileID, err = store.LatestInState(ctx, d.o.Pool, controlplane.TypeWorkflowDispatch, "reconciliation_required", d.since)
		return reconcileID != 0, err
	})
	if err != nil {
		return 0, err
	}
	d.say("release control plane: %s's dispatch (effect %d) is in reconciliation_required: it may have run, so it is never re-sent blindly", repoWeb, reconcileID)
	return reconcileID, nil
}
