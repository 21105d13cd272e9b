// Package nats is pgoutbox's NATS JetStream target and its broker scale-out
// path (docs/scale-out.md).
//
// It has three parts, each importing only the root package pgoutbox and the
// NATS client:
//
//   - the nats.publish effect type (PublishType, Publish): an effect that
//     publishes a message to a JetStream subject with Nats-Msg-Id = the
//     effect's idempotency key. The publish ack completes the effect; a
//     duplicate ack is success. It is replay-safe.
//   - the Relay: for chosen queues, effects are not delivered in-process but
//     published, one message per effect, to the stream (subject
//     <prefix>.<queue>.<effect_type>, Nats-Msg-Id = idempotency key, body an
//     Envelope) and handed over in PostgreSQL.
//   - the Consumer: a durable pull consumer per queue (explicit ack, ack
//     wait shorter than the effect's lease, bounded deliveries) that
//     delivers each message with the same registered handlers as in-process
//     delivery and records the outcome in PostgreSQL with the same fencing.
//
// # Guarantees
//
// PostgreSQL stays the source of truth; JetStream only carries the trigger
// to deliver. Every guarantee of the engine holds:
//
//  1. The transaction boundary: effects are enqueued exactly as before; the
//     relay reads committed effects only.
//  2. Nothing is lost. A relay claim is a lease: a relay that dies before it
//     hands its batch over loses the lease, the sweeper makes the effects
//     available again, and the relay publishes them again — as duplicates,
//     which JetStream drops by Nats-Msg-Id within the duplicate window. A
//     hand-over keeps the effect leased (lease_owner "pgoutbox:handoff") under
//     a lease as long as the retry horizon: should JetStream lose the
//     message, the sweeper recovers the effect when that lease expires and
//     it is relayed again. A duplicate ack whose stored message is gone
//     (consumed: the effect was replayed from dead_letter) or belongs to
//     another effect is published again under "<key>~<sequence>".
//  3. At-least-once for replay-safe types; never twice for the others. A
//     consumer takes an effect over in PostgreSQL before it delivers it: a
//     fenced statement that succeeds only for a handed-over effect, the
//     relay's own lease on it (the message can outrun the hand-over), an
//     expired lease or an available effect. A live lease held by another
//     consumer is waited for (NakWithDelay until it expires), never
//     duplicated. When the effect's delivery_started_at is already set, the
//     previous delivery's outcome is unknown: it goes to
//     reconciliation_required and the message is terminated.
//  4. Fencing: take-over gives the consumer its own token; completion,
//     failure, hand-back and extension are fenced by id, token and type. A
//     consumer whose lease was lost writes nothing.
//  5. Isolation: each queue has its own durable consumer, pull loop and
//     concurrency.
//  6. Per-key ordering (pgoutbox.Effect.OrderingKey): the relay claims with
//     the engine's head-of-line rule, and a relayed effect stays leased
//     (handed over) until a consumer completes it, so a key's next effect is
//     published only once the previous one is completed (or dead-lettered
//     under a move-on type). The consumer records its types' choices
//     (pgoutbox.EffectType.OrderingMovesOn) for its queues when it starts,
//     and so does the relay for RelayConfig.Types: the relay's claim reads
//     them (pgoutbox.RegisterOrdering). A key has at most one message in
//     the stream at a time; its throughput is one JetStream and PostgreSQL
//     round trip per effect. Effects without a key are relayed as before.
//
// # Outcomes
//
// success → completed (group-committed) and Ack. Retry (or ambiguous for a
// replay-safe type) with attempts left → handed back in PostgreSQL and
// NakWithDelay(backoff): JetStream redelivers the same message, so the
// stream holds one message per effect. Permanent or exhausted → dead_letter
// and Term. Ambiguous for a non-replay-safe type → reconciliation_required
// and Term. A message's last JetStream delivery (MaxDeliver) is never left
// pending: a retry is then scheduled in PostgreSQL and the relay publishes
// the effect again when it is due. Long deliveries are kept alive with
// InProgress acks while their lease is extended.
//
// # Built on the public API
//
// The relay and the consumer use the root package's public API only: the
// hand-off calls (pgoutbox.ClaimRelayLeases, HandOver, TakeOver,
// Lease.HandBack, Lease.Release, Lease.DeadLetter) and the delivery of a
// claimed lease (pgoutbox.Lease.Deliver with a Completer, a LeaseKeeper and
// DeliverOptions.HandBack), the engine a Client delivers with. An adapter
// for another broker can be built on the same calls.
//
// # Tracing
//
// A relayed effect's trace runs from its enqueue to its delivery, as with a
// Client (docs/operations.md, "Tracing"). The relay publishes the
// traceparent its enqueue stored (the creation context) as the message's
// traceparent header (HeaderTraceparent), unchanged: the relay forwards, it
// does not produce, and starts no span of its own. A consumer continues
// the trace from the effect's row, which it reads when it takes the effect
// over, not from the header: the row is the source of truth and the two
// are the same (the header exists for other subscribers of the stream).
// Each delivery is a consumer span "process <queue>" made with
// ConsumerConfig.TracerProvider, ended with its outcome.
//
// # The duplicate window
//
// Relay and consumer refuse to start when the stream's duplicate window is
// shorter than the retry horizon (RetryPolicy.Horizon):
// within the horizon the relay may publish an effect again and counts on
// JetStream to drop it. The stream must have work-queue retention, so that a
// consumed message leaves the stream.
package nats
