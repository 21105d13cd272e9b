package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// ReconcileSkew widens the inspect window before delivery_started_at, for
// clock skew between PostgreSQL and GitHub.
const ReconcileSkew = 2 * time.Minute

// Pending is a dispatch whose outcome is unknown.
type Pending struct {
	pgoutbox.Record
	Dispatch WorkflowDispatch `json:"dispatch"`
}

// ErrNotFound is returned for an effect id that is not a reconciliation
// record of github.workflow.dispatch.
var ErrNotFound = errors.New("controlplane: no reconciliation_required dispatch with that id")

// ListPending lists the dispatches in reconciliation_required, oldest first.
func (a *App) ListPending(ctx context.Context, limit int) ([]Pending, error) {
	recs, err := pgoutbox.ListRecords(ctx, a.pool, pgoutbox.StateReconciliationRequired, QueueOutbox, limit)
	if err != nil {
		return nil, err
	}
	var out []Pending
	for _, r := range recs {
		p := Pending{Record: r}
		if r.Type == TypeWorkflowDispatch {
			_ = json.Unmarshal(r.Payload, &p.Dispatch)
		}
		out = append(out, p)
	}
	return out, nil
}

func (a *App) pending(ctx context.Context, id int64) (Pending, error) {
	r, ok, err := pgoutbox.GetRecord(ctx, a.pool, id)
	if err != nil {
		return Pending{}, err
	}
	if !ok || r.State != pgoutbox.StateReconciliationRequired || r.Type != TypeWorkflowDispatch {
		return Pending{}, ErrNotFound
	}
	p := Pending{Record: r}
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
	// Matches says the run name (or the persisted workflow_run_id) carries
	// this release run and attempt.
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
// created since delivery started and points at the ones whose run name
// carries the release run and attempt. It changes nothing.
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
			Matches: r.DisplayTitle == want || (persisted != nil && *persisted == r.ID)}
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

// Resolve records that the dispatch did happen as workflowRunID: the record
// is completed and the attempt advances to dispatched with that run id.
func (a *App) Resolve(ctx context.Context, id, workflowRunID int64) error {
	if workflowRunID <= 0 {
		return errors.New("controlplane: --workflow-run-id must be positive")
	}
	p, err := a.pending(ctx, id)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if err := pgoutbox.Resolve(ctx, tx, id, TypeWorkflowDispatch, map[string]any{
			"action": "resolve", "workflow_run_id": workflowRunID, "resolved_at": time.Now().UTC(),
		}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlResolveAttempt, p.Dispatch.ExecutionAttemptID, workflowRunID)
		return err
	})
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
