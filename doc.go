// Package pgoutbox is a transactional outbox for PostgreSQL.
//
// An application writes an effect — a side effect it owes the outside world,
// such as creating a GitHub Check Run, indexing a record or publishing a
// message — with [Enqueue], inside the same pgx transaction as the state
// change that caused it: the effect exists if and only if that transaction
// commits. A [Client] claims effects with FOR UPDATE SKIP LOCKED under fenced
// leases, delivers each through the [Handler] registered for its type, and
// records the outcome: completed, retried with backoff, dead-lettered (and
// replayable), or — for a type that must not be sent twice — moved to
// reconciliation_required when its outcome is unknown. PostgreSQL is the only
// moving part.
//
// This comment is the library's manual, in reading order. The design
// (docs/design.md in the repository) follows one effect through the code;
// the runnable examples (go doc -all, example_test.go) show each step.
//
// # Quick start
//
// Apply the engine's schema once, with [github.com/pgoutbox/pgoutbox/migrations.Up]
// or `pgoutbox migrate`. It creates the schema pgoutbox and nothing else.
//
// Enqueue inside the transaction that changes your state. The idempotency
// key makes the enqueue idempotent: the same key in the same queue returns
// the existing effect and writes nothing. [Key] builds one from parts:
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, `UPDATE orders SET state = 'paid' WHERE id = $1`, id); err != nil {
//			return err
//		}
//		_, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{
//			Queue:   "emails",
//			Type:    "email.receipt",
//			Key:     pgoutbox.Key("email.receipt", id),
//			Payload: map[string]any{"order_id": id},
//		})
//		return err
//	})
//
// Register a handler for each effect type and run a [Client]:
//
//	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
//		Queues: map[string]pgoutbox.QueueConfig{"emails": {Concurrency: 10}},
//		Types: []pgoutbox.EffectType{{
//			Name:       "email.receipt",
//			ReplaySafe: true, // the target deduplicates by d.Key
//			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
//				return send(ctx, d.Key, d.Payload)
//			},
//		}},
//	})
//	// handle err
//	err = client.Start(ctx)
//	defer client.Stop(shutdownCtx) // stop claiming, let deliveries finish, release the rest
//
// # Reading order
//
// Writing effects: [Effect] (its fields and their bounds), [Enqueue] and
// [EnqueueBatch], [Key]; invalid input is refused with a typed error that
// writes nothing ([InvalidEffectError], [PayloadTooLargeError],
// [CredentialKeyError], [JSONBoundsError]). Payloads are bounded
// ([MaxPayloadBytes], [MaxPayloadDepth], [MaxNumberLength],
// [MaxNumberExponent], also checked by [CheckJSONBounds]) and may not carry
// a credential-like key at any depth ([IsCredentialKey]). Applications in
// other languages enqueue through the SQL API under the same rules
// (docs/any-language.md).
//
// Delivering them: [Config] and [QueueConfig] (every default is a documented
// XxxDefault constant), [EffectType] with its [Handler], [PageHandler] or
// [TxHandler], [Delivery] (what a handler sees, and [Delivery.OnComplete]
// for writes that must commit with the completion), [NewClient],
// [Client.Start] and [Client.Stop]. A started Client also recovers expired
// leases and deletes old rows itself; [Client.Sweep] and [Client.Prune] do
// either once, on demand. [Client.Subscribe] reports each delivery's
// recorded outcome as an [Event]; metrics go to Config.Registerer, logs to
// Config.Logger.
//
// Outcomes: a handler returns nil, or an error built by [Retry],
// [RetryAfter], [Permanent] or [Ambiguous] ([OutcomeError]); an unclassified
// error is a retry for a replay-safe type and ambiguous otherwise.
//
// States and the operator's side: [State], [GetEffect] and [ListEffects]
// ([EffectRow]), [Resolve] for a reconciliation record, and the manual lease
// API for delivering outside a Client: [ClaimLeases] and [Lease]. Behind a
// transaction-pooling proxy see [BehindTransactionPooler] (docs/poolers.md).
//
// Targets: the adapters in adapters/ (GitHub, Solr, SPARQL, NATS JetStream,
// Standard Webhooks HTTP delivery) are handlers and clients built on this
// package; adapters/github/githubtest and adapters/solr/solrtest are
// emulators for tests.
//
// # Guarantees
//
// The contract, stated in full in docs/design.md:
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
// # Ordering
//
// Effects of one queue that share an [Effect.OrderingKey] are delivered one
// at a time, in the order their transactions committed; other keys and
// unordered effects are not held back. [EffectType.OrderingMovesOn] lets a
// key move on past its dead letters ([RegisterOrdering]; docs/ordering.md).
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
// the effect is delivered again. A worker that dies during the hold has that
// attempt uncounted; the next delivery of its effects runs under a durable
// lease, which counts it (docs/design.md, "Lease modes"). docs/benchmarks.md
// measures both modes.
//
// # Delivering outside a Client
//
// A program that claims effects itself (ClaimLeases, or a broker
// consumer's TakeOver) delivers each Lease with Lease.Deliver: the same
// handler call, classification, fencing and routing as a Client. A
// Completer group-commits the completions, a LeaseKeeper extends the leases
// while their deliveries run, and an EnqueueListener wakes the claim loop.
// A broker relay claims effects with ClaimRelayLeases (no attempt counted)
// and records the broker's acceptance with HandOver; its consumers take
// each message's effect over with TakeOver and hand a retry back with
// Lease.HandBack (docs/scale-out.md). The applications and adapters of this
// module (projection, controlplane, adapters/nats) are built on this public
// API alone; QueueBacklog and KeysPastAvailable are the projection's reads.
//
// Workers wake on LISTEN/NOTIFY (at most one notification per queue per 10
// ms, decided when the producer commits) with a polling fallback and a
// catch-up claim after every reconnect.
package pgoutbox
