package controlplane

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// CheckRunCreate is the payload of github.check_run.create.
type CheckRunCreate struct {
	ReleaseRunID   int64  `json:"release_run_id"`
	InstallationID int64  `json:"installation_id"`
	Repository     string `json:"repository"`
	HeadSHA        string `json:"head_sha"`
	Name           string `json:"name"`
	ExternalID     string `json:"external_id"`
}

// WorkflowDispatch is the payload of github.workflow.dispatch.
type WorkflowDispatch struct {
	ReleaseRunID       int64  `json:"release_run_id"`
	ExecutionAttemptID int64  `json:"execution_attempt_id"`
	AttemptNumber      int    `json:"attempt_number"`
	InstallationID     int64  `json:"installation_id"`
	Repository         string `json:"repository"`
	Workflow           string `json:"workflow"`
	Ref                string `json:"ref"`
}

// Inputs are the workflow inputs the dispatch sends.
func (d WorkflowDispatch) Inputs() map[string]string {
	return map[string]string{
		"release_run_id":       strconv.FormatInt(d.ReleaseRunID, 10),
		"execution_attempt_id": strconv.FormatInt(d.ExecutionAttemptID, 10),
	}
}

// RunName is the run name the documented release workflow sets
// (`run-name: release ${{ inputs.release_run_id }} attempt ${{ inputs.execution_attempt_id }}`).
func RunName(releaseRunID, attemptID int64) string {
	return fmt.Sprintf("release %d attempt %d", releaseRunID, attemptID)
}

// ParseRunName is RunName's inverse; ok=false for any other title.
func ParseRunName(title string) (releaseRunID, attemptID int64, ok bool) {
	_, err := fmt.Sscanf(title, "release %d attempt %d", &releaseRunID, &attemptID)
	if err != nil || RunName(releaseRunID, attemptID) != title {
		return 0, 0, false
	}
	return releaseRunID, attemptID, true
}

// CheckRunComplete is the payload of github.check_run.complete.
type CheckRunComplete struct {
	ReleaseRunID       int64  `json:"release_run_id"`
	ExecutionAttemptID int64  `json:"execution_attempt_id"`
	InstallationID     int64  `json:"installation_id"`
	Repository         string `json:"repository"`
	Conclusion         string `json:"conclusion"`
	WorkflowRunID      int64  `json:"workflow_run_id"`
}

// repo is an installed, active repository.
type repo struct {
	ID             int64
	InstallationID int64
	FullName       string
}

// errNotInstalled means the repository is unknown, removed, or its
// installation is not active.
var errNotInstalled = errors.New("repository not installed")

func activeRepository(ctx context.Context, tx pgx.Tx, id int64, fullName string) (repo, error) {
	var r repo
	err := tx.QueryRow(ctx, sqlActiveRepository, id, fullName).Scan(&r.ID, &r.InstallationID, &r.FullName)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, errNotInstalled
	}
	return r, err
}

// StartedRun reports a release run and the attempt it dispatched.
type StartedRun struct {
	ReleaseRunID       int64 `json:"release_run_id"`
	ExecutionAttemptID int64 `json:"execution_attempt_id,omitempty"`
	AttemptNumber      int   `json:"attempt_number,omitempty"`
	// Existing is true when this repository, ref and commit already had a
	// release run: nothing new was written.
	Existing bool `json:"existing"`
}

// startRun creates a release run for (repo, ref, sha) with attempt 1 and
// enqueues its Check Run and its dispatch, all in tx. A run that exists is
// returned as is.
func (a *App) startRun(ctx context.Context, tx pgx.Tx, r repo, ref, sha, source string) (StartedRun, error) {
	var runID int64
	err := tx.QueryRow(ctx, sqlInsertRun, r.InstallationID, r.ID, ref, sha, source).Scan(&runID)
	if errors.Is(err, pgx.ErrNoRows) {
		if err := tx.QueryRow(ctx, sqlFindRun, r.ID, ref, sha).Scan(&runID); err != nil {
			return StartedRun{}, err
		}
		return StartedRun{ReleaseRunID: runID, Existing: true}, nil
	}
	if err != nil {
		return StartedRun{}, err
	}
	if _, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
		Queue: QueueOutbox, Type: TypeCheckRunCreate, MaxAttempts: a.cfg.MaxAttempts, OrderingKey: runOrderingKey(runID),
		Key: pgoutbox.Key(TypeCheckRunCreate, strconv.FormatInt(runID, 10)),
		Payload: CheckRunCreate{ReleaseRunID: runID, InstallationID: r.InstallationID, Repository: r.FullName,
			HeadSHA: sha, Name: a.cfg.CheckRunName, ExternalID: strconv.FormatInt(runID, 10)},
	}); err != nil {
		return StartedRun{}, err
	}
	started, err := a.newAttempt(ctx, tx, runID, r, ref)
	started.ReleaseRunID = runID
	return started, err
}

// newAttempt supersedes the run's open attempts, creates the next one and
// enqueues its dispatch (a new key per attempt), in tx.
func (a *App) newAttempt(ctx context.Context, tx pgx.Tx, runID int64, r repo, ref string) (StartedRun, error) {
	if _, err := tx.Exec(ctx, sqlSupersedeOpenAttempts, runID); err != nil {
		return StartedRun{}, err
	}
	s := StartedRun{ReleaseRunID: runID}
	if err := tx.QueryRow(ctx, sqlInsertAttempt, runID).Scan(&s.ExecutionAttemptID, &s.AttemptNumber); err != nil {
		return StartedRun{}, err
	}
	if _, err := tx.Exec(ctx, sqlReopenRun, runID); err != nil {
		return StartedRun{}, err
	}
	_, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
		Queue: QueueOutbox, Type: TypeWorkflowDispatch, MaxAttempts: a.cfg.MaxAttempts, OrderingKey: runOrderingKey(runID),
		Key: pgoutbox.Key(TypeWorkflowDispatch, strconv.FormatInt(s.ExecutionAttemptID, 10)),
		Payload: WorkflowDispatch{ReleaseRunID: runID, ExecutionAttemptID: s.ExecutionAttemptID,
			AttemptNumber: s.AttemptNumber, InstallationID: r.InstallationID, Repository: r.FullName,
			Workflow: a.cfg.Workflow, Ref: ref},
	})
	return s, err
}

// runOrderingKey is the ordering key of a release run's GitHub effects
// (docs/design.md, "Per-key ordering"): Check Run create, each attempt's
// dispatch and Check Run completion reach GitHub one at a time, in the order
// their transactions committed. The handlers' own checks (a stored
// check_run_id, the attempt still being the latest) stay as defence in
// depth.
func runOrderingKey(runID int64) string { return "release_run:" + strconv.FormatInt(runID, 10) }

// runInfo is what effects need to know about a release run.
type runInfo struct {
	ID             int64
	InstallationID int64
	RepositoryID   int64
	FullName       string
	Ref            string
	HeadSHA        string
	CheckRunID     *int64
}

// querier is a transaction or the pool.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func loadRun(ctx context.Context, q querier, id int64) (runInfo, error) {
	var ri runInfo
	err := q.QueryRow(ctx, sqlLoadRun, id).Scan(&ri.ID, &ri.InstallationID, &ri.RepositoryID, &ri.FullName,
		&ri.Ref, &ri.HeadSHA, &ri.CheckRunID)
	return ri, err
}

// runFacts is what a workflow run says about itself (in its workflow_run
// webhook or GitHub's answer about it) that decides whether it can be a
// release run's.
type runFacts struct {
	Path       string // ".github/workflows/release.yml", maybe "@ref"-suffixed
	WorkflowID int64
	Event      string // what triggered it
	HeadSHA    string
}

// dispatchEvent is the trigger of every run the control plane dispatches.
const dispatchEvent = "workflow_dispatch"

// notReleaseRun is the one rule that decides whether a workflow run may
// conclude (or resolve) an execution attempt of a release run on headSHA:
// it must be a run of workflow (the configured release workflow, see
// sameWorkflow), triggered by workflow_dispatch, on headSHA. It returns why
// not, or "" when the run passes. The repository is checked by the caller
// (the webhook's repository id, or asking GitHub in the dispatch's
// repository); the run name or the persisted run id then picks the attempt.
func notReleaseRun(f runFacts, workflow, headSHA string) string {
	switch {
	case !sameWorkflow(f.Path, f.WorkflowID, workflow):
		return fmt.Sprintf("is a run of %s, not of %s", f.Path, workflow)
	case f.Event != dispatchEvent:
		return fmt.Sprintf("was triggered by %q, not %s", f.Event, dispatchEvent)
	case f.HeadSHA != headSHA:
		return fmt.Sprintf("is on commit %q, not the release run's %s", f.HeadSHA, headSHA)
	}
	return ""
}

// sameWorkflow reports whether a run of workflow file path (id workflowID)
// belongs to workflow, as a dispatch names it: a numeric workflow id, or a
// file name (release.yml) or path.
func sameWorkflow(runPath string, workflowID int64, workflow string) bool {
	if id, err := strconv.ParseInt(workflow, 10, 64); err == nil {
		return workflowID == id
	}
	p, _, _ := strings.Cut(runPath, "@") // "….yml@refs/heads/main" for some runs
	return p == workflow || path.Base(p) == path.Base(workflow) && strings.HasPrefix(p, ".github/workflows/")
}

// concludeAttempt records a workflow run's conclusion on its attempt and
// (for the latest attempt) on the run, and enqueues the Check Run
// completion, in tx.
func (a *App) concludeAttempt(ctx context.Context, tx pgx.Tx, runID, attemptID, workflowRunID int64, conclusion string) error {
	if _, err := tx.Exec(ctx, sqlCompleteAttempt, attemptID, conclusion, workflowRunID); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlCompleteRunIfLatest, runID, attemptID, conclusion); err != nil {
		return err
	}
	ri, err := loadRun(ctx, tx, runID)
	if err != nil {
		return err
	}
	_, err = pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
		Queue: QueueOutbox, Type: TypeCheckRunComplete, MaxAttempts: a.cfg.MaxAttempts, OrderingKey: runOrderingKey(runID),
		Key: pgoutbox.Key(TypeCheckRunComplete, strconv.FormatInt(attemptID, 10)),
		Payload: CheckRunComplete{ReleaseRunID: runID, ExecutionAttemptID: attemptID, InstallationID: ri.InstallationID,
			Repository: ri.FullName, Conclusion: conclusion, WorkflowRunID: workflowRunID},
	})
	return err
}
