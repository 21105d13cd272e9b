package pgoutbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"
)

// Delivery is one claimed effect handed to a handler.
type Delivery struct {
	// ID is the effect's id.
	ID int64
	// Queue, Type and Key are the effect's queue, type and idempotency key.
	Queue, Type, Key string
	// Payload is the effect's JSON payload.
	Payload json.RawMessage
	// Attempt counts from 1 for the first delivery.
	Attempt int
	// MaxAttempts is the attempt after which a failure dead-letters.
	MaxAttempts int
	// CreatedAt is when the enqueuing transaction wrote the effect.
	CreatedAt time.Time
	// LeaseToken identifies this lease (not a secret; useful in call logs),
	// a UUID in both lease modes. Under a durable lease it is the lease's
	// token (pgoutbox.effects.lease_token), new at every claim. Under a
	// row-lock lease (QueueConfig.RowLockLease) the row has no token: the
	// claim transaction's row lock is the lease, and LeaseToken is a random
	// UUID naming that transaction, shared by the effects it claimed and
	// never written to the database; when the delivery's outcome is then
	// recorded under a durable lease (a failure, OnComplete transitions, a
	// handler that outlived the hold), LeaseToken becomes that lease's
	// token after the handler returned.
	LeaseToken string
	// OrderingKey is the effect's Effect.OrderingKey ("" for none): the
	// engine delivers this effect only after every earlier effect of its
	// queue and ordering key (docs/design.md, "Per-key ordering").
	OrderingKey string

	onComplete []func(ctx context.Context, tx pgx.Tx) error
	span       trace.Span // the consumer span (tracing.go); nil once ended
}

// OnComplete registers a transition to run inside the transaction that marks
// this effect completed (e.g. persist a returned check_run_id). If a
// transition fails, the transaction rolls back: a replay-safe effect is
// retried; any other keeps its lease until it expires and the sweeper routes
// it to reconciliation_required.
func (d *Delivery) OnComplete(fn func(ctx context.Context, tx pgx.Tx) error) {
	d.onComplete = append(d.onComplete, fn)
}
