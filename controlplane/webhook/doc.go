// Package webhook verifies and normalizes GitHub webhook deliveries for the
// release control plane.
//
// It is pure Go: no database, no network, no global state. The HTTP endpoint
// (POST /webhooks/github) parses the X-Hub-Signature-256 header with
// [NewVerifier] before it reads anything (a request without a well-formed
// one is refused unread), writes the raw body to the [Verifier] as it
// arrives and calls [Verifier.Verify], then [Normalize] with the
// X-GitHub-Event header, and stores the [Normalized] record (never the raw
// body) in the webhook inbox.
//
// # Signatures
//
// [Verify] accepts exactly one form: "sha256=" followed by the lowercase or
// uppercase hex encoding of HMAC-SHA256(secret, body), as GitHub sends it in
// X-Hub-Signature-256. The comparison is constant time ([crypto/hmac.Equal]).
// The legacy SHA-1 header (X-Hub-Signature, "sha1=…") is never accepted, not
// even as a fallback, and an empty secret never verifies anything
// ([ErrEmptySecret]). Errors are typed ([ErrMissingSignature],
// [ErrBadSignature], [ErrEmptySecret]) and their text never contains the
// secret, the expected signature or the received one. [Sign] computes the
// header value; the GitHub emulator and the demo use it.
//
// # Normalization
//
// [Normalize] turns an event name and a raw JSON body into a small typed
// record. The events the lifecycle worker acts on (installation,
// installation_repositories, push, release, check_run, check_suite,
// workflow_run, ping) fill one event-specific section; every other event is
// returned with Ignored set (not an error) together with whatever
// installation and repository identifiers its payload carries. A body that is
// not a JSON object, or whose fields have the wrong JSON types, yields
// [ErrMalformed].
//
// The record is bounded whatever the payload: every string is cut (on a UTF-8
// boundary) so that its JSON encoding is at most [MaxStringBytes] bytes,
// repository lists keep at most [MaxRepositories] entries and at most
// [MaxRepositoryListBytes] bytes of encoded entries (the Truncated and Total
// fields say what was dropped), so the JSON encoding of a [Normalized] is
// always below [MaxEncodedBytes] (64 KiB), the engine's payload bound.
package webhook
