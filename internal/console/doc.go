// Package console is the operator console: server-rendered pages (no build
// step) under /console/ where incidents are handled in the browser, grown
// from the projection's read-only /workers page (docs/console.md).
//
// Pages: the queues overview, the effects list (filters: queue, state,
// type, key prefix, error text; keyset paging by id, newest first), one
// effect's detail (state, attempts, a timeline with each failed attempt
// from pgoutbox.effect_attempts, last error, the subject, the payload with
// every value under a credential-like key redacted; errors pass
// RedactError), the dead letters, the reconciliation records and the audit
// of every action. The overview and the effects list refresh themselves in
// place (live.js, embedded; Config.LiveRefresh), with a pause toggle.
//
// Actions: replay one, selected or all dead letters of a queue, always in
// two steps (the first lists what will move; the second replays those ids
// only, at most the confirmed count);
// resolve a reconciliation record with a workflow run (checked against
// GitHub, or unverified with force, as `pgoutbox reconcile resolve`) and
// supersede one with a reason. A reconciliation record is never replayed.
//
// # Safety
//
//   - Sign-in: the operator token (PGOUTBOX_OPERATOR_TOKEN), compared in
//     constant time and never logged, is exchanged for a session: a random
//     256-bit id in a cookie that is HttpOnly, SameSite=Strict, limited to
//     /console/ and Secure when the request came over TLS. Sessions live in
//     this process's memory (a restart signs everyone out) and expire after
//     Config.SessionTTL.
//   - With a token configured every page needs the session (or the bearer
//     token, for scripts); without one the console is read-only, says so,
//     and refuses every action.
//   - Every form carries a CSRF token tied to the session; a POST without a
//     valid session and that token is answered 403 and changes nothing.
//   - A POST whose Origin (or Referer) names another host is answered 403
//     before its form is read.
//   - Operator-token guesses are limited per client address
//     (Config.SignInFailuresMax in Config.SignInWindow, or Config.Limiter,
//     shared with the server's operator routes): each sign-in and each
//     bearer check is counted before it is compared; past the limit they
//     answer 429 with Retry-After, uncompared.
//   - Every action, done or refused, is recorded in pgoutbox.console_audit
//     (migration 00010): the operator's label, a digest of the session
//     (never its id), when, what and how many effects changed. A replay's
//     audit row commits in the replay's own transaction.
package console
