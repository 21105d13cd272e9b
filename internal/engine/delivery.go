package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Delivery is one claimed effect handed to a handler (the root package's
// Delivery, documented there).
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

	onComplete []TxFunc
	span       trace.Span // the consumer span; nil once ended
}

// OnComplete registers a transition to run inside the transaction that marks
// this effect completed (e.g. persist a returned check_run_id). If a
// transition fails, the transaction rolls back: a replay-safe effect is
// retried; any other keeps its lease until it expires and the sweeper routes
// it to reconciliation_required.
func (d *Delivery) OnComplete(fn func(ctx context.Context, tx pgx.Tx) error) {
	d.onComplete = append(d.onComplete, fn)
}

// Transitions returns what d's handler registered with OnComplete.
func Transitions(d *Delivery) []TxFunc { return d.onComplete }

// Handler delivers one effect to the outside world (the root package's
// Handler).
type Handler func(ctx context.Context, d *Delivery) error

// TxHandler runs an internal job inside the transaction that marks it
// completed (the root package's TxHandler).
type TxHandler func(ctx context.Context, tx pgx.Tx, d *Delivery) error

// PageHandler delivers several effects of one type in one call (the root
// package's PageHandler).
type PageHandler func(ctx context.Context, ds []*Delivery) []error

// PageErrors is each of n deliveries' error from a PageHandler call that
// returned errs, or called (its panic, else nil): errs itself when it has
// n errors, n nils when it is nil, and for any other length n errors
// saying so (a handler that miscounts has delivered nothing known).
func PageErrors(errs []error, called error, n int) []error {
	out := make([]error, n)
	var all error
	switch {
	case called != nil:
		all = called
	case errs == nil:
	case len(errs) == n:
		copy(out, errs)
		return out
	default:
		all = fmt.Errorf("page handler returned %d errors for %d deliveries", len(errs), n)
	}
	for i := range out {
		out[i] = all
	}
	return out
}

// CheckHandlers says what is wrong with t's handlers: exactly one of
// Handler, PageHandler and TxHandler is set, and a PageHandler's type is
// replay-safe; nil when nothing is.
func CheckHandlers(t EffectType) error {
	n := 0
	for _, set := range []bool{t.Handler != nil, t.PageHandler != nil, t.TxHandler != nil} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return errors.New("set exactly one of Handler, PageHandler and TxHandler")
	case t.PageHandler != nil && !t.ReplaySafe:
		return errors.New("a PageHandler's type must be ReplaySafe: a page is delivered at least once")
	}
	return nil
}

// External reports whether t delivers an external effect: a Handler or a
// PageHandler, not a TxHandler.
func External(t EffectType) bool {
	return t.TxHandler == nil && (t.Handler != nil || t.PageHandler != nil)
}

// EffectType registers how an effect type is delivered (the root package's
// EffectType, documented there). Replay safety is decided here, never by
// the enqueuer.
type EffectType struct {
	// Name is the effect_type value, e.g. "github.check_run.create".
	Name string
	// ReplaySafe types may be delivered more than once (at-least-once, the
	// target dedups by key). A type that is not replay-safe gets
	// delivery_started_at committed before its handler runs, and an unknown
	// outcome sends it to reconciliation_required, never back to available.
	ReplaySafe bool
	// Handler delivers an external effect. Exactly one of Handler,
	// PageHandler and TxHandler is set.
	Handler Handler
	// PageHandler delivers external effects several at a time: a replay-safe
	// type's effects of one page of a batch queue in one call, or one
	// effect per call elsewhere.
	PageHandler PageHandler
	// TxHandler runs an internal job inside its completion transaction.
	TxHandler TxHandler
	// Timeout bounds one delivery of this type, overriding the queue's
	// DeliveryTimeout; it must be below Config.LeaseDuration. Default zero:
	// the queue's DeliveryTimeout.
	Timeout time.Duration
	// OrderingMovesOn chooses what a dead letter of this type does to the
	// later effects of its ordering key (Effect.OrderingKey): false (the
	// default, strict) holds them back until the dead letter is replayed
	// and delivered (or deleted); true lets the key move on, and the dead
	// letter, if replayed, is delivered after the effects that overtook it.
	// The choice is per queue: a Client with queues records its types'
	// choice for each of its queues in the database
	// (pgoutbox.ordering_choices) when it starts, and so do the NATS relay
	// and consumer; every claimer, and the operator commands, read it from
	// there. A start that changes a queue's recorded choice is logged (see
	// RegisterOrdering): give a type one choice per queue.
	OrderingMovesOn bool
}

// JobOf is the job that delivers d with t (the zero EffectType: not
// registered, a retry) within timeout; the caller sets its Fence.
func JobOf(t EffectType, d *Delivery, timeout time.Duration) *Job {
	j := &Job{
		Attempt: d.Attempt, MaxAttempts: d.MaxAttempts, ReplaySafe: t.ReplaySafe, Timeout: timeout,
		Transitions: func() []TxFunc { return d.onComplete },
	}
	switch {
	case t.TxHandler != nil:
		j.ReplaySafe = true // its writes commit with its completion or not at all
		j.TxHandler = func(ctx context.Context, tx pgx.Tx) error { return t.TxHandler(ctx, tx, d) }
	case t.Handler != nil:
		j.Handler = func(ctx context.Context) error { return t.Handler(ctx, d) }
	case t.PageHandler != nil:
		j.Handler = func(ctx context.Context) error {
			return PageErrors(t.PageHandler(ctx, []*Delivery{d}), nil, 1)[0]
		}
	default:
		err := Retry(fmt.Errorf("no handler registered for effect type %q", d.Type))
		j.ReplaySafe = true
		j.Handler = func(context.Context) error { return err }
	}
	return j
}

// pgoutbox's span attributes of a delivery's end.
const (
	// AttrOutcome is the outcome of a delivery's span.
	AttrOutcome = attribute.Key("pgoutbox.outcome")
	// AttrState is the state a delivery left its effect in.
	AttrState = attribute.Key("pgoutbox.state")
)

// SetSpan keeps span, d's consumer span, in d for EndSpan.
func SetSpan(d *Delivery, span trace.Span) { d.span = span }

// EndSpan ends d's consumer span, if it has one, with the delivery's
// outcome and the state it left the effect in ("" when unknown). Only the
// first call ends it.
func EndSpan(d *Delivery, o Outcome, state State) {
	span := d.span
	if span == nil {
		return
	}
	d.span = nil
	if span.IsRecording() {
		span.SetAttributes(AttrOutcome.String(string(o)))
		if state != "" {
			span.SetAttributes(AttrState.String(string(state)))
		}
		if o != OutcomeSuccess {
			span.SetAttributes(semconv.ErrorTypeKey.String(string(o)))
			span.SetStatus(codes.Error, string(o))
		}
	}
	span.End()
}
