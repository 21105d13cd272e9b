// Package github is a protocol-faithful, in-memory emulator of the parts of
// GitHub's REST API and webhooks that the release control plane uses. Tests
// and the demo run the control plane against it instead of api.github.com.
//
// [New] starts a server on a loopback port; point the control plane's
// GITHUB_API_URL at [Server.URL], give it [Server.AppID] and
// [Server.AppPrivateKeyPEM], and register what exists on "GitHub" with
// [Server.AddInstallation], [Server.AddRepository] and [Server.AddWorkflow].
//
// # Protocol
//
// The emulator follows GitHub's documented REST API (version 2022-11-28):
//
//   - POST /app/installations/{installation_id}/access_tokens verifies the
//     RS256 app JWT (signature against the app's public key, iss = the app id
//     or client id, exp at most 10 minutes ahead, iat not in the future beyond
//     [Options.ClockSkew]) and answers 201 with a token that expires in an
//     hour. An unknown installation is 404, a suspended one 403.
//   - Every other route needs "Authorization: Bearer <token>" or
//     "Authorization: token <token>" carrying an unexpired token the emulator
//     issued (401 "Bad credentials" otherwise) for the installation that owns
//     the repository (404 "Not Found" otherwise, as GitHub hides repositories
//     it will not show you).
//   - Check runs: list for a ref (check_name, status, filter=latest|all,
//     app_id, per_page, page, with a Link header), create (name and head_sha
//     required), get, update. A conclusion outside GitHub's enumeration, and
//     "stale" (only GitHub may set it), answers 422.
//   - Pagination as GitHub's: page defaults to 1 and per_page to 30, per_page
//     is capped at 100; a list longer than one page carries a Link header
//     with rel="prev", "next", "last" and "first" (each only where it
//     applies); a page past the end is empty.
//   - Actions: create a workflow dispatch (ref required; declared inputs
//     checked; at most 25 inputs; return_run_details answers 200 with the run
//     id and URLs, otherwise 204), list workflow runs of a workflow or of a
//     repository (created, event, status, branch, actor, head_sha, per_page,
//     page, with a Link header; with any of those filters at most
//     [SearchLimit] runs are listed, newest first, while total_count counts
//     every match), get a workflow run, get a workflow. A dispatch
//     creates a run whose display_title is the workflow's run-name with
//     ${{ inputs.* }} and ${{ github.* }} expressions rendered; the documented
//     release workflow ([ReleaseWorkflow]) is registered on every repository
//     unless [Options.NoReleaseWorkflow] is set.
//   - Unknown routes answer 404; malformed JSON bodies 400 "Problems parsing
//     JSON"; failed validation 422; every error body is GitHub's
//     {"message", "documentation_url", "status"} shape.
//   - Every response carries Date, X-GitHub-Request-Id, X-GitHub-Media-Type
//     and the x-ratelimit-limit/remaining/used/reset/resource headers. Each
//     installation (and the app itself) has a primary rate limit of
//     [Options.RateLimit] requests per hour; at zero remaining the emulator
//     answers 403 "API rate limit exceeded…" with x-ratelimit-remaining: 0.
//
// # Faults
//
// [Server.InjectFault] programs failures per route (GitHub's operation ids,
// e.g. [RouteDispatchWorkflow]), method or path: a status with an optional
// body and Retry-After, a secondary rate limit (429 or 403 with Retry-After),
// a lost response (the request IS processed, then the connection is closed
// without a response), a reset before processing (closed, nothing happens),
// a delay that honours the request's context, and a malformed 2xx body.
// [Options.Delay] / [Server.SetDelay] slow every call down.
//
// # Inspection and webhooks
//
// Tests inspect state in Go, not over HTTP: [Server.CheckRuns],
// [Server.Dispatches], [Server.WorkflowRuns], [Server.Calls] (method, path,
// route, arrival time, status; to assert that nothing was sent before a
// Retry-After) and [Server.Deliveries]. [Server.Wait] blocks until a
// condition on the state holds, so tests never sleep.
//
// When [Options.WebhookURL] and [Options.WebhookSecret] are set,
// [Server.CompleteRun], [Server.StartRun], [Server.Push] and
// [Server.RerequestCheckRun] deliver GitHub-shaped webhooks synchronously,
// signed like GitHub signs them (X-Hub-Signature-256, plus the legacy
// X-Hub-Signature, which receivers must ignore), with X-GitHub-Event and a
// fresh X-GitHub-Delivery GUID; [Server.Redeliver] repeats a delivery with
// its GUID.
//
// All state lives in memory behind one mutex; a Server is safe for
// concurrent use. Call [Server.Close] when done (it closes the listener and
// the webhook client's idle connections).
package githubtest
