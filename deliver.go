package pgoutbox

// Delivering a lease claimed outside a Client (ClaimLeases, a broker
// consumer's TakeOver) exactly as a Client delivers: the same handler call,
// classification, fencing and routing, through the engine's own deliverer.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// DeliverOptions configures (*Lease).Deliver. The zero value delivers with
// the engine's defaults, completing the effect in its own statement.
type DeliverOptions struct {
	// Timeout bounds the handler when the effect type sets no Timeout of
	// its own; 0 means DeliveryTimeoutDefault. Keep it below the lease, or
	// extend the lease meanwhile (LeaseKeeper).
	Timeout time.Duration
	// BackoffCap caps a retry's backoff; 0 means BackoffCapDefault.
	BackoffCap time.Duration
	// Completer, when set, completes the effect in a group commit shared
	// with other deliveries; nil completes it in its own statement.
	Completer *Completer
	// HandBack, when set, is offered every failure before it is recorded:
	// a broker consumer hands a retry back to its broker (Lease.HandBack)
	// instead of scheduling it in PostgreSQL. It returns handled=false to
	// let Deliver record the failure as usual, and an error wrapping
	// ErrLeaseLost when the lease was lost.
	HandBack func(ctx context.Context, f Failure) (handled bool, err error)
	// Stopping, when set, is the cancellation cause (context.Cause of the
	// ctx given to Deliver) that means the caller is shutting down: a
	// delivery interrupted so that would be retried, or is ambiguous, is
	// then released for another worker at once instead of after a backoff.
	Stopping error
	// TracerProvider makes the delivery's consumer span "process <queue>"
	// (docs/operations.md, "Tracing"), the span a Client makes: a child of
	// the enqueue's span on the first attempt, linked to it on every
	// attempt, ended with the outcome and the state. Default
	// otel.GetTracerProvider(), the global provider, a no-op until the
	// application installs an SDK.
	TracerProvider trace.TracerProvider
}

// Failure is a failed delivery offered to DeliverOptions.HandBack.
type Failure struct {
	// Err is the handler's error.
	Err error
	// Outcome is Err's classification.
	Outcome Outcome
	// Retry is true when the failure would be retried (not dead-lettered
	// or routed to reconciliation_required).
	Retry bool
	// Delay is the retry's backoff.
	Delay time.Duration
	// Stopping is true when the delivery was interrupted by shutdown
	// (DeliverOptions.Stopping).
	Stopping bool
}

// DeliverResult is how (*Lease).Deliver ended.
type DeliverResult struct {
	// Outcome is the handler's classified outcome.
	Outcome Outcome
	// State is the effect's state once the outcome was recorded:
	// StateCompleted, or where the failure went; empty when nothing was
	// recorded (Deliver returned an error).
	State State
	// Err is the handler's error (nil when it succeeded).
	Err error
	// ReplaySafe is the effect type's replay safety as delivered (a
	// TxHandler, or an unregistered type that is retried, counts as
	// replay-safe).
	ReplaySafe bool
	// HandedBack is true when DeliverOptions.HandBack recorded the failure.
	HandedBack bool
	// Lag is enqueue → completion (database clock) when completed.
	Lag time.Duration
}

// RecordError is returned by (*Lease).Deliver when the delivery's outcome
// could not be written. The lease is kept: once it expires the sweeper
// recovers the effect (a replay-safe one is delivered again; one that is
// not goes to reconciliation_required if its delivery had started).
type RecordError struct {
	// Op names the write that failed: "complete" and "commit" (the effect
	// was delivered), "reconcile" (delivered, the completion transition
	// failed, and so did routing it to reconciliation_required), "fail",
	// "hand back" or "mark started".
	Op string
	// Err is the write's error.
	Err error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("pgoutbox: recording the outcome (%s): %v", e.Op, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// Delivered reports whether the handler's work happened before the write
// failed (the effect must not be assumed undone).
func (e *RecordError) Delivered() bool { return engine.Op(e.Op).Delivered() }

// Deliver delivers the leased effect with t's handler, as a Client does:
// for a type that is not replay-safe it first commits that delivery starts,
// then runs the handler under a panic guard and its timeout, and records
// the classified outcome (Retry, RetryAfter, Permanent, Ambiguous), fenced
// by the lease, together with the transitions the handler registered
// (Delivery.OnComplete). A TxHandler runs inside the completion
// transaction. t may be the zero EffectType (no handler registered): the
// effect is then retried. The delivery is traced as a Client's is: a
// consumer span continuing the enqueue's trace, ended with the outcome
// (DeliverOptions.TracerProvider); the handler's ctx carries it.
//
// It returns an error wrapping ErrLeaseLost when the lease was lost
// (nothing was written), or a *RecordError when the outcome could not be
// written; otherwise the outcome was recorded and DeliverResult says
// where the effect went. The lease must not be used afterwards.
func (l *Lease) Deliver(ctx context.Context, pool *pgxpool.Pool, t EffectType, opts DeliverOptions) (DeliverResult, error) {
	if t.Name != "" && t.Name != l.Type {
		return DeliverResult{}, fmt.Errorf("pgoutbox: deliver effect %d of type %q with type %q", l.ID, l.Type, t.Name)
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = opts.Timeout
	}
	if timeout <= 0 {
		timeout = DeliveryTimeoutDefault
	}
	backoffCap := opts.BackoffCap
	if backoffCap <= 0 {
		backoffCap = BackoffCapDefault
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	ctx = startDeliverySpan(ctx, tp.Tracer(TracerName), "", &l.Delivery, l.traceparent)
	j := engine.JobOf(t, &l.Delivery, timeout)
	j.Fence = l.fence
	if opts.HandBack != nil {
		j.Retry = func(ctx context.Context, r engine.Route, herr error, stopping bool) (bool, bool, error) {
			handled, err := opts.HandBack(ctx, Failure{Err: herr, Outcome: r.Outcome,
				Retry: r.Kind == store.FailRetry, Delay: r.Delay, Stopping: stopping})
			switch {
			case !handled:
				return false, false, nil
			case errors.Is(err, ErrLeaseLost):
				return true, false, nil
			}
			return true, true, err
		}
	}
	d := engine.Deliverer{Pool: pool, BackoffCap: backoffCap, Shutdown: opts.Stopping}
	if opts.Completer != nil {
		d.Committer = opts.Completer.c
	}
	r := d.Run(ctx, j)
	res := DeliverResult{Outcome: r.Outcome, Err: r.Err, ReplaySafe: j.ReplaySafe, HandedBack: r.HandedBack, Lag: r.Lag}
	switch r.Status {
	case engine.Completed:
		res.State = StateCompleted
	case engine.Failed:
		res.State = r.State
	}
	engine.EndSpan(&l.Delivery, r.Outcome, res.State)
	switch r.Status {
	case engine.Completed, engine.Failed:
		return res, nil
	case engine.LeaseLost:
		return res, leaseLost(string(r.Op), l.ID)
	default: // WriteFailed, Unrecorded
		return res, &RecordError{Op: string(r.Op), Err: r.WriteErr}
	}
}

// Completer group-commits the completions of deliveries made with
// (*Lease).Deliver (DeliverOptions.Completer): each of its two committers
// completes whatever completions are queued, up to its batch, in one
// statement, as a Client does (Config.CompletionBatch).
type Completer struct{ c *engine.Committer }

// NewCompleter starts a Completer of at most batch completions per
// statement on db; batch ≤ 0 means CompletionBatchDefault. Close it once
// its deliveries have ended.
func NewCompleter(db DB, batch int) *Completer {
	if batch <= 0 {
		batch = CompletionBatchDefault
	}
	return &Completer{c: engine.StartCommitter(db, batch, 2)}
}

// Close commits what is queued and stops the Completer; it must not be
// used afterwards.
func (c *Completer) Close() { c.c.Close() }

// LeaseKeeper extends the leases of deliveries in flight, all in one
// statement per tick, as a Client's extender does: a delivery whose lease
// was lost is cancelled with cause ErrLeaseLost.
type LeaseKeeper struct {
	leases engine.Leases
	ext    engine.Extender
}

// NewLeaseKeeper returns a LeaseKeeper that extends each held lease to
// now()+lease (database clock) on db; failures go to log (nil discards).
func NewLeaseKeeper(db DB, lease time.Duration, log *slog.Logger) *LeaseKeeper {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &LeaseKeeper{}
	k.ext = engine.Extender{DB: db, Leases: &k.leases, Lease: lease, LostCause: ErrLeaseLost, Log: log}
	return k
}

// Hold keeps l extended until Drop: cancel is called with ErrLeaseLost
// when the lease is lost, and kept (when not nil) after each extension
// that kept it (a broker consumer's in-progress acknowledgement).
func (k *LeaseKeeper) Hold(l *Lease, cancel context.CancelCauseFunc, kept func()) {
	k.leases.Put(&engine.Held{Fence: l.fence, Cancel: cancel, Kept: kept})
}

// Drop stops extending l.
func (k *LeaseKeeper) Drop(l *Lease) { k.leases.Delete(l.fence) }

// Run extends the held leases every interval until ctx ends.
func (k *LeaseKeeper) Run(ctx context.Context, interval time.Duration) { k.ext.Run(ctx, interval) }

// ExtendNow extends the held leases now.
func (k *LeaseKeeper) ExtendNow(ctx context.Context) { k.ext.ExtendNow(ctx) }
