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
//   - A workflow dispatch is not replay-safe: when its outcome is unknown it
//     goes to reconciliation_required, and an operator resolves it with
//     `pgoutbox reconcile` (see Reconciler).
package controlplane
