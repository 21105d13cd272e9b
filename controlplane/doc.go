// Package controlplane is the release control plane, a GitHub App built on
// the pgoutbox engine: signed webhooks → inbox → lifecycle jobs → release
// runs → GitHub effects (Check Run create and complete, workflow dispatch).
//
// Guarantees:
//   - The webhook endpoint never calls GitHub. It verifies the
//     X-Hub-Signature-256 HMAC in constant time, and in one transaction writes
//     the inbox row (normalized event, body SHA-256, never the raw body) and
//     one lifecycle job; a redelivered X-GitHub-Delivery writes nothing.
//     Bad input (401, 400, 413, 415) writes nothing.
//   - The lifecycle worker applies each event inside the job's completion
//     transaction (a pgoutbox TxHandler) and writes the GitHub effects it
//     implies in that same transaction: state and effects commit together or
//     not at all. Events for uninstalled or removed repositories change
//     nothing.
//   - GitHub effects run on their own queue (control_plane_outbox), so a slow
//     or failing GitHub never delays lifecycle planning
//     (control_plane_jobs).
//   - A workflow run concludes an execution attempt only if it is a release
//     run: a run of the configured release workflow, triggered by
//     workflow_dispatch, on the release run's commit, in its repository
//     (by persisted run id or by run name alike); reconcile inspect and
//     resolve hold runs to the same rule.
//   - A Check Run completion applies only as the release run's latest word
//     (its latest attempt's recorded conclusion); an older attempt's
//     completion never reaches GitHub.
//   - A workflow dispatch is not replay-safe: when its outcome is unknown it
//     goes to reconciliation_required, and an operator resolves it with
//     `pgoutbox reconcile` (see Reconciler). A dispatch that was sent and
//     answered has a known outcome, also when a Re-run superseded its
//     attempt meanwhile: its run id is recorded on that attempt.
package controlplane
