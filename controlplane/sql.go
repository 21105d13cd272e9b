package controlplane

// Every SQL statement of the control plane, in one place.
const (
	sqlInsertInbox = `
INSERT INTO control_plane.webhook_inbox
    (delivery_id, event, action, installation_id, repository_id, body_sha256, normalized)
VALUES ($1, $2, nullif($3, ''), nullif($4, 0::bigint), nullif($5, 0::bigint), $6, $7)
ON CONFLICT DO NOTHING
RETURNING id`

	// sqlKnownDelivery tells, after sqlInsertInbox wrote nothing, a
	// redelivery (the delivery id is known) from a replayed body (only the
	// body is: webhook_inbox_body_sha256_key, migration 00020).
	sqlKnownDelivery = `
SELECT EXISTS (SELECT 1 FROM control_plane.webhook_inbox WHERE delivery_id = $1)`

	sqlLoadInbox = `
SELECT normalized, status FROM control_plane.webhook_inbox WHERE id = $1 FOR UPDATE`

	sqlFinishInbox = `
UPDATE control_plane.webhook_inbox SET status = $2, outcome = left($3, 500), processed_at = now()
WHERE id = $1`

	sqlUpsertInstallation = `
INSERT INTO control_plane.installations (id, account_login, state) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET
    account_login = CASE WHEN excluded.account_login <> '' THEN excluded.account_login
                         ELSE control_plane.installations.account_login END,
    state = excluded.state, updated_at = now()`

	sqlEnsureInstallation = `
INSERT INTO control_plane.installations (id, account_login, state) VALUES ($1, $2, 'active')
ON CONFLICT (id) DO NOTHING`

	sqlTouchInstallation = `
UPDATE control_plane.installations SET updated_at = now() WHERE id = $1`

	sqlUpsertRepository = `
INSERT INTO control_plane.repositories (id, installation_id, full_name, state) VALUES ($1, $2, $3, 'active')
ON CONFLICT (id) DO UPDATE SET installation_id = excluded.installation_id,
    full_name = excluded.full_name, state = 'active', updated_at = now()`

	sqlRemoveRepository = `
UPDATE control_plane.repositories SET state = 'removed', updated_at = now()
WHERE id = $1 AND installation_id = $2`

	sqlRemoveInstallationRepositories = `
UPDATE control_plane.repositories SET state = 'removed', updated_at = now() WHERE installation_id = $1`

	// sqlActiveRepository finds a repository that is active under an active
	// installation, by id or by full name.
	sqlActiveRepository = `
SELECT r.id, r.installation_id, r.full_name
FROM control_plane.repositories r
JOIN control_plane.installations i ON i.id = r.installation_id
WHERE (r.id = $1 OR ($1 = 0 AND r.full_name = $2))
  AND r.state = 'active' AND i.state = 'active'`

	sqlInsertRun = `
INSERT INTO control_plane.release_runs (installation_id, repository_id, ref, head_sha, source)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (repository_id, ref, head_sha) DO NOTHING
RETURNING id`

	sqlFindRun = `
SELECT id FROM control_plane.release_runs WHERE repository_id = $1 AND ref = $2 AND head_sha = $3`

	sqlLoadRun = `
SELECT rr.id, rr.installation_id, rr.repository_id, r.full_name, rr.ref, rr.head_sha, rr.check_run_id
FROM control_plane.release_runs rr JOIN control_plane.repositories r ON r.id = rr.repository_id
WHERE rr.id = $1`

	sqlSupersedeOpenAttempts = `
UPDATE control_plane.execution_attempts SET state = 'superseded', completed_at = now()
WHERE release_run_id = $1 AND state IN ('dispatching', 'dispatched')`

	sqlInsertAttempt = `
INSERT INTO control_plane.execution_attempts (release_run_id, attempt_number)
SELECT $1, coalesce(max(attempt_number), 0) + 1 FROM control_plane.execution_attempts WHERE release_run_id = $1
RETURNING id, attempt_number`

	sqlReopenRun = `
UPDATE control_plane.release_runs SET state = 'in_progress', conclusion = NULL, updated_at = now() WHERE id = $1`

	// sqlAttemptForRun matches a completed workflow run to its attempt in
	// the webhook's repository: by the persisted workflow_run_id, else
	// (dispatch response lost) by the run name the release workflow sets
	// from its inputs. The caller checks the run's commit against
	// head_sha (notReleaseRun).
	sqlAttemptForRun = `
SELECT a.id, a.release_run_id, a.state, a.workflow_run_id IS NULL, rr.head_sha
FROM control_plane.execution_attempts a
JOIN control_plane.release_runs rr ON rr.id = a.release_run_id
WHERE rr.repository_id = $4
  AND (a.workflow_run_id = $1
       OR (a.workflow_run_id IS NULL AND a.release_run_id = $2 AND a.id = $3))
ORDER BY a.workflow_run_id IS NULL
LIMIT 1
FOR UPDATE OF a`

	sqlCompleteAttempt = `
UPDATE control_plane.execution_attempts
SET state = 'completed', conclusion = $2, workflow_run_id = coalesce(workflow_run_id, $3), completed_at = now()
WHERE id = $1`

	// sqlCompleteRunIfLatest concludes the run only for its latest attempt.
	sqlCompleteRunIfLatest = `
UPDATE control_plane.release_runs rr SET state = 'completed', conclusion = $3, updated_at = now()
WHERE rr.id = $1 AND $2 = (SELECT max(id) FROM control_plane.execution_attempts WHERE release_run_id = rr.id)`

	sqlSetCheckRunID = `
UPDATE control_plane.release_runs SET check_run_id = $2, updated_at = now() WHERE id = $1`

	// sqlLatestWord is what a Check Run completion is checked against: the
	// run's Check Run and its latest attempt (the highest id: every new
	// attempt supersedes the open ones) with that attempt's state and
	// conclusion.
	sqlLatestWord = `
SELECT rr.check_run_id, a.id, a.state, a.conclusion
FROM control_plane.release_runs rr
JOIN LATERAL (SELECT id, state, conclusion FROM control_plane.execution_attempts
              WHERE release_run_id = rr.id ORDER BY id DESC LIMIT 1) a ON true
WHERE rr.id = $1`

	// sqlRecordDispatch records the workflow run an attempt's dispatch
	// created, whatever became of the attempt meanwhile: a dispatching
	// attempt advances to dispatched; a superseded one (a Re-run while its
	// dispatch was in flight) or a completed one (its run's completion,
	// matched by run name, came first) keeps its state and gets the run id,
	// so the run's own completion is recognised. It changes no row (the
	// caller fails) only when the attempt is missing or records another
	// run.
	sqlRecordDispatch = `
UPDATE control_plane.execution_attempts
SET workflow_run_id = coalesce(workflow_run_id, $2),
    state = CASE WHEN state = 'dispatching' THEN 'dispatched' ELSE state END,
    dispatched_at = coalesce(dispatched_at, now())
WHERE id = $1 AND (workflow_run_id IS NULL OR workflow_run_id = $2)`

	sqlAttemptState = `
SELECT state FROM control_plane.execution_attempts WHERE id = $1`

	sqlAttemptWorkflowRun = `
SELECT workflow_run_id FROM control_plane.execution_attempts WHERE id = $1`
)
