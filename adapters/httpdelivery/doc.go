// Package httpdelivery delivers effects to an HTTP endpoint of the user's
// own service, in any language, signed as the Standard Webhooks
// specification says (https://www.standardwebhooks.com), so the service
// verifies each request with that specification's published libraries.
//
// # The request
//
// One POST per delivery attempt to the endpoint's configured URL (never a
// URL from a payload), with the body
//
//	{"type": "<effect type>", "timestamp": "<enqueue time, RFC 3339>", "data": <the effect's payload>}
//
// and the headers
//
//   - webhook-id: the effect's idempotency key, the same on every attempt,
//     so the receiver deduplicates by it;
//   - webhook-timestamp: this attempt's time, integer Unix seconds;
//   - webhook-signature: "v1," and the base64 HMAC-SHA256 of
//     "<webhook-id>.<webhook-timestamp>.<body>" under the endpoint's secret
//     (a "whsec_" base64 secret of 24 to 64 bytes, read from the environment
//     or a file, never stored in the outbox);
//   - content-type: application/json, user-agent: pgoutbox, and
//     pgoutbox-queue, pgoutbox-effect-type, pgoutbox-effect-id and
//     pgoutbox-attempt, for the receiver's logs;
//   - traceparent (and tracestate), W3C Trace Context: the delivery's span
//     (a Client's CONSUMER span "process <queue>", docs/operations.md
//     "Tracing"), when it has a valid span context, so the receiver's spans
//     join the trace of the request that enqueued the effect.
//
// Redirects are not followed (a 3xx is an answer like any other).
//
// # Outcomes
//
// The answer maps to the outcome a Go handler would return: 2xx is
// completed; 429 and 503 retry no earlier than their Retry-After (a plain
// retry without one); 408 and every other 5xx retry; every other status
// (3xx, 4xx) is permanent. A request that never left this process (no
// connection, a refused dial, the endpoint's concurrency bound not
// reached before the delivery timeout) is a retry: nothing was sent. A request that left
// and got no answer (a timeout, a reset) is an unknown outcome: a retry for
// a replay-safe type, reconciliation_required for one that is not, as with
// any handler. At most MaxAnswerBytes of an answer are read.
//
// # Bounds
//
// Each endpoint has its own concurrency bound (Endpoint.Concurrency) and
// timeout; answers are read up to MaxAnswerBytes and error texts carry at
// most ErrorExcerptBytes of the answer, never the secret or the URL's query.
package httpdelivery
