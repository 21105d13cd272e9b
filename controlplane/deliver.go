package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
)

// GitHub is the part of the GitHub client the effect handlers use.
type GitHub interface {
	ListCheckRuns(ctx context.Context, installationID int64, repo, ref, name string) ([]github.CheckRun, error)
	CreateCheckRun(ctx context.Context, installationID int64, repo, name, headSHA, externalID string) (github.CheckRun, error)
	CompleteCheckRun(ctx context.Context, installationID int64, repo string, checkRunID int64, conclusion string) error
	DispatchWorkflow(ctx context.Context, installationID int64, repo, workflow, ref string, inputs map[string]string) (github.DispatchResult, error)
	ListWorkflowRuns(ctx context.Context, installationID int64, repo, workflow string, since time.Time) ([]github.WorkflowRun, error)
	GetWorkflowRun(ctx context.Context, installationID int64, repo string, runID int64) (github.WorkflowRun, error)
}

func decode[T any](d *pgoutbox.Delivery) (T, error) {
	var v T
	if err := json.Unmarshal(d.Payload, &v); err != nil {
		return v, pgoutbox.Permanent(fmt.Errorf("%s payload: %w", d.Type, err))
	}
	return v, nil
}

// createCheckRun is replay-safe: it reuses the Check Run whose name and
// external_id match the release run, and creates one only when absent. The
// returned id is persisted in the completion transaction.
func (a *App) createCheckRun(ctx context.Context, d *pgoutbox.Delivery) error {
	p, err := decode[CheckRunCreate](d)
	if err != nil {
		return err
	}
	runs, err := a.gh.ListCheckRuns(ctx, p.InstallationID, p.Repository, p.HeadSHA, p.Name)
	if err != nil {
		return err
	}
	var id int64
	for _, cr := range runs {
		if cr.Name == p.Name && cr.ExternalID == p.ExternalID {
			id = cr.ID
			break
		}
	}
	if id == 0 {
		cr, err := a.gh.CreateCheckRun(ctx, p.InstallationID, p.Repository, p.Name, p.HeadSHA, p.ExternalID)
		if err != nil {
			return err
		}
		id = cr.ID
	}
	d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sqlSetCheckRunID, p.ReleaseRunID, id)
		return err
	})
	return nil
}

// dispatchWorkflow is not replay-safe. The engine commits
// delivery_started_at before it runs; an attempt superseded before that is
// not dispatched (a permanent error, nothing sent). The workflow_run_id
// GitHub returns is persisted with the completion on the attempt, also when
// a Re-run superseded it while the request was in flight (the dispatch was
// sent and its outcome is known: no reconciliation); the completion fails,
// leaving the effect for reconciliation, only if the attempt is missing or
// already records another run.
func (a *App) dispatchWorkflow(ctx context.Context, d *pgoutbox.Delivery) error {
	p, err := decode[WorkflowDispatch](d)
	if err != nil {
		return err
	}
	var state string
	if err := a.pool.QueryRow(ctx, sqlAttemptState, p.ExecutionAttemptID).Scan(&state); err != nil {
		return pgoutbox.Retry(fmt.Errorf("load attempt %d: %w", p.ExecutionAttemptID, err)) // nothing sent
	}
	if state != "dispatching" {
		return pgoutbox.Permanent(fmt.Errorf("attempt %d is %s: not dispatched", p.ExecutionAttemptID, state))
	}
	res, err := a.gh.DispatchWorkflow(ctx, p.InstallationID, p.Repository, p.Workflow, p.Ref, p.Inputs())
	if err != nil {
		return err
	}
	d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sqlRecordDispatch, p.ExecutionAttemptID, res.WorkflowRunID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("attempt %d is missing or records another workflow run than %d", p.ExecutionAttemptID, res.WorkflowRunID)
		}
		return nil
	})
	return nil
}

// completeCheckRun is replay-safe (setting a conclusion twice is harmless)
// and applies only the run's latest word: the completion of the run's
// latest attempt, with the conclusion recorded on that attempt. A
// completion of an older attempt (a dead letter replayed after a Re-run's
// attempt concluded, or one that waited behind it) completes without
// calling GitHub, so it never overwrites the newer conclusion. A payload
// that disagrees with the database (an attempt that has not concluded, or
// another conclusion) is refused: a permanent error, nothing sent. The
// run's effects reach GitHub one at a time (runOrderingKey), so no newer
// completion is sent between this check and the call.
func (a *App) completeCheckRun(ctx context.Context, d *pgoutbox.Delivery) error {
	p, err := decode[CheckRunComplete](d)
	if err != nil {
		return err
	}
	var checkRunID *int64
	var latest int64
	var state string
	var conclusion *string
	err = a.pool.QueryRow(ctx, sqlLatestWord, p.ReleaseRunID).Scan(&checkRunID, &latest, &state, &conclusion)
	if errors.Is(err, pgx.ErrNoRows) {
		return pgoutbox.Permanent(fmt.Errorf("release run %d has no execution attempt: nothing to complete", p.ReleaseRunID))
	}
	if err != nil {
		return pgoutbox.Retry(err)
	}
	if latest != p.ExecutionAttemptID {
		a.log.Info("check run completion skipped: not the release run's latest attempt", "release_run", p.ReleaseRunID,
			"attempt", p.ExecutionAttemptID, "latest_attempt", latest, "conclusion", p.Conclusion)
		return nil
	}
	if state != "completed" || conclusion == nil || *conclusion != p.Conclusion {
		return pgoutbox.Permanent(fmt.Errorf("attempt %d is %s with conclusion %s, not concluded %q: nothing sent",
			latest, state, orNone(conclusion), p.Conclusion))
	}
	if checkRunID == nil {
		return pgoutbox.Retry(errors.New("check run of release run " + strconv.FormatInt(p.ReleaseRunID, 10) + " not created yet"))
	}
	return a.gh.CompleteCheckRun(ctx, p.InstallationID, p.Repository, *checkRunID, github.CheckRunConclusion(*conclusion))
}

func orNone(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}
