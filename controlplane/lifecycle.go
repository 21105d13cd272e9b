package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

// inboxReceived is the status of an inbox row waiting to be applied.
const inboxReceived = "received"

// webhookJob is the payload of a lifecycle job.
type webhookJob struct {
	InboxID int64 `json:"inbox_id"`
}

// applyWebhook is the lifecycle worker: it runs inside the job's completion
// transaction, applies the event and writes the effects it implies.
func (a *App) applyWebhook(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
	var job webhookJob
	if err := json.Unmarshal(d.Payload, &job); err != nil || job.InboxID == 0 {
		return pgoutbox.Permanent(fmt.Errorf("lifecycle job payload: %v", err))
	}
	var raw []byte
	var status string
	if err := tx.QueryRow(ctx, sqlLoadInbox, job.InboxID).Scan(&raw, &status); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return pgoutbox.Permanent(fmt.Errorf("inbox row %d not found", job.InboxID))
		}
		return err
	}
	// The row's own job applies it in this transaction, together with its
	// status: a row that is no longer "received" was applied (or ignored)
	// already, and a job naming it is not its job (a second job enqueued
	// by hand or through the SQL API). Applying it again would repeat its
	// effects, e.g. dispatch the release workflow once more for a stored
	// check_run rerequested.
	if status != inboxReceived {
		return pgoutbox.Permanent(fmt.Errorf("inbox row %d is %s, not waiting to be applied: nothing done", job.InboxID, status))
	}
	var n webhook.Normalized
	if err := json.Unmarshal(raw, &n); err != nil {
		return pgoutbox.Permanent(fmt.Errorf("inbox row %d: %w", job.InboxID, err))
	}
	outcome, applied, err := a.apply(ctx, tx, n)
	if err != nil {
		return err
	}
	status = "ignored"
	if applied {
		status = "applied"
	}
	_, err = tx.Exec(ctx, sqlFinishInbox, job.InboxID, status, outcome)
	return err
}

// apply dispatches on the event; it returns a short outcome for the inbox and
// whether anything changed.
func (a *App) apply(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	switch {
	case n.Ignored:
		return "event not handled", false, nil
	case n.Installation != nil:
		return a.applyInstallation(ctx, tx, n)
	case n.InstallationRepositories != nil:
		return a.applyInstallationRepositories(ctx, tx, n)
	case n.Push != nil:
		return a.applyPush(ctx, tx, n)
	case n.CheckRun != nil:
		return a.applyCheckRun(ctx, tx, n)
	case n.WorkflowRun != nil:
		return a.applyWorkflowRun(ctx, tx, n)
	}
	return "recorded", false, nil // ping, release, check_suite: acknowledged
}

func (a *App) applyInstallation(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	inst := n.Installation
	if n.InstallationID == 0 {
		return "installation event without an installation id", false, nil
	}
	switch n.Action {
	case "created":
		if _, err := tx.Exec(ctx, sqlUpsertInstallation, n.InstallationID, inst.AccountLogin, "active"); err != nil {
			return "", false, err
		}
		for _, r := range inst.Repositories.Repositories {
			if _, err := tx.Exec(ctx, sqlUpsertRepository, r.ID, n.InstallationID, r.FullName); err != nil {
				return "", false, err
			}
		}
		return fmt.Sprintf("installation created with %d repositories", len(inst.Repositories.Repositories)), true, nil
	case "deleted":
		if _, err := tx.Exec(ctx, sqlUpsertInstallation, n.InstallationID, inst.AccountLogin, "deleted"); err != nil {
			return "", false, err
		}
		_, err := tx.Exec(ctx, sqlRemoveInstallationRepositories, n.InstallationID)
		return "installation deleted", true, err
	case "suspend":
		_, err := tx.Exec(ctx, sqlUpsertInstallation, n.InstallationID, inst.AccountLogin, "suspended")
		return "installation suspended", true, err
	case "unsuspend":
		_, err := tx.Exec(ctx, sqlUpsertInstallation, n.InstallationID, inst.AccountLogin, "active")
		return "installation unsuspended", true, err
	case "new_permissions_accepted":
		_, err := tx.Exec(ctx, sqlTouchInstallation, n.InstallationID)
		return "permissions accepted", true, err
	}
	return "installation action " + n.Action + " not handled", false, nil
}

func (a *App) applyInstallationRepositories(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	ir := n.InstallationRepositories
	if n.InstallationID == 0 {
		return "event without an installation id", false, nil
	}
	// An installation made before this service saw its "created" event.
	if _, err := tx.Exec(ctx, sqlEnsureInstallation, n.InstallationID, ""); err != nil {
		return "", false, err
	}
	for _, r := range ir.Added.Repositories {
		if _, err := tx.Exec(ctx, sqlUpsertRepository, r.ID, n.InstallationID, r.FullName); err != nil {
			return "", false, err
		}
	}
	for _, r := range ir.Removed.Repositories {
		if _, err := tx.Exec(ctx, sqlRemoveRepository, r.ID, n.InstallationID); err != nil {
			return "", false, err
		}
	}
	return fmt.Sprintf("%d added, %d removed", len(ir.Added.Repositories), len(ir.Removed.Repositories)), true, nil
}

const zeroSHA = "0000000000000000000000000000000000000000"

func (a *App) applyPush(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	p := n.Push
	if ok, _ := path.Match(a.cfg.TagPattern, p.Ref); !ok {
		return "ref does not match " + a.cfg.TagPattern, false, nil
	}
	if p.Deleted || p.After == "" || p.After == zeroSHA {
		return "tag deleted", false, nil
	}
	r, err := activeRepository(ctx, tx, n.RepositoryID, "")
	if errors.Is(err, errNotInstalled) {
		return "repository not installed", false, nil
	}
	if err != nil {
		return "", false, err
	}
	s, err := a.startRun(ctx, tx, r, p.Ref, p.After, "webhook")
	if err != nil {
		return "", false, err
	}
	if s.Existing {
		return fmt.Sprintf("release run %d already exists", s.ReleaseRunID), false, nil
	}
	return fmt.Sprintf("release run %d started, attempt %d", s.ReleaseRunID, s.ExecutionAttemptID), true, nil
}

func (a *App) applyCheckRun(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	cr := n.CheckRun
	if n.Action != "rerequested" {
		return "check_run " + n.Action + " recorded", false, nil
	}
	if cr.Name != a.cfg.CheckRunName {
		return "not our check run", false, nil
	}
	var runID int64
	if _, err := fmt.Sscanf(cr.ExternalID, "%d", &runID); err != nil || runID <= 0 {
		return "check run without our external_id", false, nil
	}
	ri, err := loadRun(ctx, tx, runID)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && ri.RepositoryID != n.RepositoryID) {
		return "unknown release run", false, nil
	}
	if err != nil {
		return "", false, err
	}
	r, err := activeRepository(ctx, tx, ri.RepositoryID, "")
	if errors.Is(err, errNotInstalled) {
		return "repository not installed", false, nil
	}
	if err != nil {
		return "", false, err
	}
	s, err := a.newAttempt(ctx, tx, runID, r, ri.Ref)
	if err != nil {
		return "", false, err
	}
	return fmt.Sprintf("release run %d attempt %d dispatched", runID, s.ExecutionAttemptID), true, nil
}

func (a *App) applyWorkflowRun(ctx context.Context, tx pgx.Tx, n webhook.Normalized) (string, bool, error) {
	wr := n.WorkflowRun
	if n.Action != "completed" {
		return "workflow_run " + n.Action + " recorded", false, nil
	}
	if _, err := activeRepository(ctx, tx, n.RepositoryID, ""); errors.Is(err, errNotInstalled) {
		return "repository not installed", false, nil
	} else if err != nil {
		return "", false, err
	}
	// The rule (notReleaseRun) holds for a match by persisted run id as for
	// one by run name: a pull request's CI run named "release R attempt A"
	// (GitHub names such runs after the pull request) concludes nothing.
	// Workflow and event first, without the database; the commit once the
	// attempt (and so the release run's head SHA) is found.
	f := runFacts{Path: wr.Path, WorkflowID: wr.WorkflowID, Event: wr.TriggerEvent, HeadSHA: wr.HeadSHA}
	if why := notReleaseRun(f, a.cfg.Workflow, f.HeadSHA); why != "" {
		return fmt.Sprintf("workflow run %d %s: ignored", wr.ID, why), false, nil
	}
	runID, attemptID, _ := ParseRunName(wr.DisplayTitle)
	var id, releaseRunID int64
	var state, headSHA string
	var unlinked bool
	err := tx.QueryRow(ctx, sqlAttemptForRun, wr.ID, runID, attemptID, n.RepositoryID).Scan(&id, &releaseRunID, &state, &unlinked, &headSHA)
	if errors.Is(err, pgx.ErrNoRows) {
		return "workflow run matches no execution attempt", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if why := notReleaseRun(f, a.cfg.Workflow, headSHA); why != "" {
		return fmt.Sprintf("workflow run %d %s: ignored", wr.ID, why), false, nil
	}
	if state == "completed" || state == "superseded" {
		return fmt.Sprintf("attempt %d already %s", id, state), false, nil
	}
	conclusion := wr.Conclusion
	if conclusion == "" {
		conclusion = "neutral"
	}
	if err := a.concludeAttempt(ctx, tx, releaseRunID, id, wr.ID, conclusion); err != nil {
		return "", false, err
	}
	how := "by workflow_run_id"
	if unlinked {
		how = "by run name"
	}
	return fmt.Sprintf("release run %d attempt %d concluded %s (matched %s)", releaseRunID, id, conclusion, how), true, nil
}
