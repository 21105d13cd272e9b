package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
)

// ReconcileSkew widens the inspect window before delivery_started_at, for
// clock skew between PostgreSQL and GitHub.
const ReconcileSkew = 2 * time.Minute

// Pending is a dispatch whose outcome is unknown.
type Pending struct {
	pgoutbox.EffectRow
	Dispatch WorkflowDispatch `json:"dispatch"`
}

// ErrNotFound is returned for an effect id that is not a reconciliation
// record of github.workflow.dispatch.
var ErrNotFound = errors.New("controlplane: no reconciliation_required dispatch with that id")

// ListPending lists the dispatches in reconciliation_required, oldest first.
func (a *App) ListPending(ctx context.Context, limit int) ([]Pending, error) {
	recs, err := pgoutbox.ListEffects(ctx, a.pool, pgoutbox.StateReconciliationRequired, QueueOutbox, limit)
	if err != nil {
		return nil, err
	}
	var out []Pending
	for _, r := range recs {
		p := Pending{EffectRow: r}
		if r.Type == TypeWorkflowDispatch {
			_ = json.Unmarshal(r.Payload, &p.Dispatch)
		}
		out = append(out, p)
	}
	return out, nil
}

func (a *App) pending(ctx context.Context, id int64) (Pending, error) {
	r, ok, err := pgoutbox.GetEffect(ctx, a.pool, id)
	if err != nil {
		return Pending{}, err
	}
	if !ok || r.State != pgoutbox.StateReconciliationRequired || r.Type != TypeWorkflowDispatch {
		return Pending{}, ErrNotFound
	}
	p := Pending{EffectRow: r}
	if err := json.Unmarshal(r.Payload, &p.Dispatch); err != nil {
		return Pending{}, fmt.Errorf("dispatch payload: %w", err)
	}
	return p, nil
}

// Candidate is a workflow run that may be the dispatch's.
type Candidate struct {
	WorkflowRunID int64     `json:"workflow_run_id"`
	DisplayTitle  string    `json:"display_title"`
	Status        string    `json:"status"`
	Conclusion    string    `json:"conclusion,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	HTMLURL       string    `json:"html_url,omitempty"`
	// Matches says the run is a workflow_dispatch run of the dispatched
	// workflow on the release run's commit (the rule a completion webhook
	// is held to) and its run name (or the persisted workflow_run_id)
	// carries this release run and attempt.
	Matches bool `json:"matches"`
}

// Inspection is what `reconcile inspect` shows.
type Inspection struct {
	Pending    Pending     `json:"pending"`
	Since      time.Time   `json:"since"`
	Candidates []Candidate `json:"candidates"`
	// Suggestion is the command to run next.
	Suggestion string `json:"suggestion"`
}

// Inspect lists the workflow runs of the dispatch's repository and workflow
// created since delivery started and points at the ones that can be the
// dispatch's (Candidate.Matches). It changes nothing.
func (a *App) Inspect(ctx context.Context, id int64) (Inspection, error) {
	p, err := a.pending(ctx, id)
	if err != nil {
		return Inspection{}, err
	}
	since := p.CreatedAt
	if p.DeliveryStartedAt != nil {
		since = *p.DeliveryStartedAt
	}
	since = since.Add(-ReconcileSkew)
	var persisted *int64
	_ = a.pool.QueryRow(ctx, sqlAttemptWorkflowRun, p.Dispatch.ExecutionAttemptID).Scan(&persisted)
	ri, err := loadRun(ctx, a.pool, p.Dispatch.ReleaseRunID)
	if err != nil {
		return Inspection{}, fmt.Errorf("load release run %d: %w", p.Dispatch.ReleaseRunID, err)
	}
	runs, err := a.gh.ListWorkflowRuns(ctx, p.Dispatch.InstallationID, p.Dispatch.Repository, p.Dispatch.Workflow, since)
	if err != nil {
		return Inspection{}, fmt.Errorf("list workflow runs: %w", err)
	}
	in := Inspection{Pending: p, Since: since}
	want := RunName(p.Dispatch.ReleaseRunID, p.Dispatch.ExecutionAttemptID)
	var match *Candidate
	for _, r := range runs {
		c := Candidate{WorkflowRunID: r.ID, DisplayTitle: r.DisplayTitle, Status: r.Status, Conclusion: r.Conclusion,
			CreatedAt: r.CreatedAt, HTMLURL: r.HTMLURL,
			Matches: notReleaseRun(facts(r), p.Dispatch.Workflow, ri.HeadSHA) == "" &&
				(r.DisplayTitle == want || (persisted != nil && *persisted == r.ID))}
		in.Candidates = append(in.Candidates, c)
		if c.Matches && match == nil {
			match = &in.Candidates[len(in.Candidates)-1]
		}
	}
	if match != nil {
		in.Suggestion = fmt.Sprintf("pgoutbox reconcile resolve %d --workflow-run-id %d", id, match.WorkflowRunID)
	} else {
		in.Suggestion = fmt.Sprintf("pgoutbox reconcile supersede %d --reason \"no workflow run found\"", id)
	}
	return in, nil
}

// ErrRunMismatch is returned by Resolve when the workflow run is not the
// dispatch's: it does not exist in the dispatch's repository, or it is a
// run of another workflow, or another event than workflow_dispatch
// triggered it, or it ran on another commit than the release run's, or its
// name does not carry the release run and attempt. Nothing was changed.
var ErrRunMismatch = errors.New("controlplane: the workflow run is not this dispatch's")

// ErrNoGitHub is returned by Resolve when the App has no GitHub client to
// verify the run with.
var ErrNoGitHub = errors.New("controlplane: verifying the workflow run needs GitHub (GITHUB_APP_ID and GITHUB_APP_PRIVATE_KEY or _FILE)")

// Resolve records that the dispatch did happen as workflowRunID: the record
// is completed and the attempt advances to dispatched with that run id.
// The run is checked against GitHub first (VerifyRun); a run that is not
// the dispatch's, or an attempt that already records another run, is
// refused with ErrRunMismatch and nothing changes.
func (a *App) Resolve(ctx context.Context, id, workflowRunID int64) error {
	if workflowRunID <= 0 {
		return errors.New("controlplane: --workflow-run-id must be positive")
	}
	p, err := a.pending(ctx, id)
	if err != nil {
		return err
	}
	run, err := a.VerifyRun(ctx, p, workflowRunID)
	if err != nil {
		return err
	}
	return a.resolve(ctx, id, p, workflowRunID, map[string]any{
		"action": "resolve", "workflow_run_id": workflowRunID, "verified": true,
		"run_name": run.DisplayTitle, "run_path": run.Path, "resolved_at": time.Now().UTC(),
	})
}

// ResolveUnverified is Resolve without asking GitHub (`reconcile resolve
// --force`): for when GitHub cannot be reached or the workflow names its
// runs otherwise. The resolution records "verified": false.
func (a *App) ResolveUnverified(ctx context.Context, id, workflowRunID int64) error {
	if workflowRunID <= 0 {
		return errors.New("controlplane: --workflow-run-id must be positive")
	}
	p, err := a.pending(ctx, id)
	if err != nil {
		return err
	}
	return a.resolve(ctx, id, p, workflowRunID, map[string]any{
		"action": "resolve", "workflow_run_id": workflowRunID, "verified": false, "resolved_at": time.Now().UTC(),
	})
}

// facts is what GitHub's answer says about a workflow run.
func facts(r github.WorkflowRun) runFacts {
	return runFacts{Path: r.Path, WorkflowID: r.WorkflowID, Event: r.Event, HeadSHA: r.HeadSHA}
}

func (a *App) resolve(ctx context.Context, id int64, p Pending, workflowRunID int64, resolution map[string]any) error {
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if err := pgoutbox.Resolve(ctx, tx, id, TypeWorkflowDispatch, resolution); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, sqlRecordDispatch, p.Dispatch.ExecutionAttemptID, workflowRunID)
		if err != nil || tag.RowsAffected() == 1 {
			return err
		}
		var recorded *int64
		err = tx.QueryRow(ctx, sqlAttemptWorkflowRun, p.Dispatch.ExecutionAttemptID).Scan(&recorded)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // no attempt to advance: the record is resolved
		}
		if err != nil || recorded == nil {
			return err
		}
		return fmt.Errorf("%w: attempt %d already records workflow run %d", ErrRunMismatch, p.Dispatch.ExecutionAttemptID, *recorded)
	})
}

// VerifyRun asks GitHub for workflow run runID in the dispatch's repository
// and checks that it is the dispatch's: it exists there (ErrRunMismatch on
// a 404), it is a run of the dispatched workflow (its path names the
// workflow file, or its workflow_id is the workflow when that is numeric),
// triggered by workflow_dispatch, on the release run's commit, and its name
// is RunName(release run, attempt). Any other failure to ask
// (a transport error, a 5xx, no GitHub client) is returned as is.
func (a *App) VerifyRun(ctx context.Context, p Pending, runID int64) (github.WorkflowRun, error) {
	if a.gh == nil {
		return github.WorkflowRun{}, ErrNoGitHub
	}
	d := p.Dispatch
	run, err := a.gh.GetWorkflowRun(ctx, d.InstallationID, d.Repository, runID)
	if errors.Is(err, github.ErrNotFound) {
		return run, fmt.Errorf("%w: GitHub has no workflow run %d in %s", ErrRunMismatch, runID, d.Repository)
	}
	if err != nil {
		return run, fmt.Errorf("controlplane: could not verify workflow run %d: %w", runID, err)
	}
	if want := RunName(d.ReleaseRunID, d.ExecutionAttemptID); run.DisplayTitle != want {
		return run, fmt.Errorf("%w: run %d is named %q, not %q (release run %d attempt %d)", ErrRunMismatch, runID,
			run.DisplayTitle, want, d.ReleaseRunID, d.ExecutionAttemptID)
	}
	ri, err := loadRun(ctx, a.pool, d.ReleaseRunID)
	if err != nil {
		return run, fmt.Errorf("controlplane: load release run %d: %w", d.ReleaseRunID, err)
	}
	if why := notReleaseRun(facts(run), d.Workflow, ri.HeadSHA); why != "" {
		return run, fmt.Errorf("%w: run %d %s", ErrRunMismatch, runID, why)
	}
	return run, nil
}

// Supersede records that the dispatch did not happen: the record is closed
// and a new execution attempt is dispatched once, with a new key.
func (a *App) Supersede(ctx context.Context, id int64, reason string) (StartedRun, error) {
	if reason == "" {
		return StartedRun{}, errors.New("controlplane: --reason is required")
	}
	p, err := a.pending(ctx, id)
	if err != nil {
		return StartedRun{}, err
	}
	var s StartedRun
	err = pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if err := pgoutbox.Resolve(ctx, tx, id, TypeWorkflowDispatch, map[string]any{
			"action": "supersede", "reason": reason, "resolved_at": time.Now().UTC(),
		}); err != nil {
			return err
		}
		ri, err := loadRun(ctx, tx, p.Dispatch.ReleaseRunID)
		if err != nil {
			return err
		}
		s, err = a.newAttempt(ctx, tx, ri.ID, repo{ID: ri.RepositoryID, InstallationID: ri.InstallationID, FullName: ri.FullName}, ri.Ref)
		return err
	})
	return s, err
}
