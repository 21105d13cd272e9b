package pgoutbox

import "github.com/pgoutbox/pgoutbox/internal/engine"

// Delivery is one claimed effect handed to a handler. Its fields:
//
//   - ID int64: the effect's id.
//   - Queue, Type, Key string: the effect's queue, type and idempotency key.
//   - Payload json.RawMessage: the effect's JSON payload: the text the
//     producer wrote when delivered from a batch queue's stream (json,
//     migration 00036), as jsonb writes it back when delivered from
//     pgoutbox.effects (keys reordered, one space after ':' and ',', a key
//     given twice kept once). The same JSON value either way: parse it,
//     never compare its bytes.
//   - Attempt int: counts from 1 for the first delivery.
//   - MaxAttempts int: the attempt after which a failure dead-letters.
//   - CreatedAt time.Time: when the enqueuing transaction wrote the effect.
//   - LeaseToken string: identifies this lease (not a secret; useful in
//     call logs), a UUID in both lease modes. Under a durable lease it is
//     the lease's token (pgoutbox.effects.lease_token), new at every claim.
//     Under a row-lock lease (QueueConfig.RowLockLease) the claim
//     transaction's row lock is the lease, and LeaseToken is a random UUID
//     naming that transaction, never written to the database; when the
//     outcome is then recorded under a durable lease (a failure, OnComplete
//     transitions, a handler that outlived the hold), LeaseToken becomes
//     that lease's token after the handler returned.
//   - OrderingKey string: the effect's Effect.OrderingKey ("" for none):
//     the engine delivers this effect only after every earlier effect of
//     its queue and ordering key (docs/design.md, "Per-key ordering").
//
// Its method OnComplete(fn func(ctx context.Context, tx pgx.Tx) error)
// registers a transition to run inside the transaction that marks the
// effect completed (e.g. persist a returned check_run_id). If a transition
// fails, the transaction rolls back: a replay-safe effect is retried; any
// other is moved to reconciliation_required.
//
// The type is the engine's (internal/engine), as River's JobRow is
// rivertype's: the root names it, the engine delivers it.
type Delivery = engine.Delivery
