// Package pgoutbox is a transactional outbox for PostgreSQL.
//
// An application writes an effect — a side effect it owes the outside world —
// with Enqueue, inside the same pgx transaction as the state change that
// caused it. A Client claims effects with FOR UPDATE SKIP LOCKED under fenced
// leases, delivers them through registered handlers, and records each outcome.
//
// # Guarantees
//
//  1. An effect exists if and only if the transaction that wrote it commits.
//  2. Every effect ends in completed, dead_letter or reconciliation_required;
//     a worker crash, a database restart or a target outage loses nothing:
//     an expired lease is recovered by a sweeper using the database clock.
//  3. Replay-safe effect types are delivered at least once; the target sees
//     the idempotency key. A type registered as not replay-safe gets
//     delivery_started_at committed before its handler runs, and is never
//     sent twice automatically: an unknown outcome (ambiguous error, crash,
//     lost lease after the start) moves it to reconciliation_required.
//  4. Completion, failure and lease extension are fenced by the effect id, the
//     lease token and the effect type. A worker whose lease was recovered
//     changes nothing and gets ErrLeaseLost.
//  5. Each queue has its own claim loop and concurrency: a slow queue or a
//     poisoned effect does not delay another queue or the other effects.
//  6. Payloads are bounded (MaxPayloadBytes, also a CHECK constraint) and may
//     not carry credential-like keys (IsCredentialKey).
//
// # States
//
// available → leased (claim, attempts+1) → completed | available (retry with
// backoff 2^attempt s ±10 % jitter, then capped; Retry-After wins when
// later, up to RetryAfterCap) | dead_letter (permanent, or attempts
// exhausted) | reconciliation_required (ambiguous outcome of a
// non-replay-safe effect). The sweeper, requeue-stale and a worker's
// shutdown release route a lease they recover to available, dead_letter
// (exhausted) or reconciliation_required (a started non-replay-safe
// effect), deciding from the row they locked.
//
// # Outcomes
//
// A Handler returns nil for success, optionally registering transitions with
// Delivery.OnComplete that commit with the completion; or an error built by
// Retry, RetryAfter, Permanent or Ambiguous. An unclassified error is a retry
// for replay-safe types and ambiguous otherwise. A TxHandler (internal jobs)
// runs inside the completion transaction itself.
//
// # Throughput
//
// Claims take up to the free slots of a queue in one statement; completions
// of many deliveries are group-committed in one statement; leases of all
// in-flight deliveries are extended in one statement every LeaseDuration/3.
// By default (QueueConfig.RowLockLease, 50 ms; RowLockLeaseOff turns it off)
// a queue leases its replay-safe effects by the row lock of the claim
// transaction instead of a durable lease: the claim
// writes nothing, and an effect whose handler returns within RowLockLease is
// completed in that same transaction, one tuple write (available →
// completed) instead of two. Whatever has not finished by then (a slow
// handler, a failure, OnComplete transitions, a type that is not replay-safe)
// is promoted to an ordinary durable lease in the closing transaction. The
// lock is the fence: if it is lost the commit fails, nothing is written and
// the effect is delivered again. A worker that dies during the hold has no
// attempt counted. docs/benchmarks.md measures both modes.
//
// Workers wake on LISTEN/NOTIFY (at most one notification per queue per 10
// ms, decided when the producer commits) with a polling fallback and a
// catch-up claim after every reconnect.
package pgoutbox
