package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// FinishTimeout bounds a delivery's final write.
const FinishTimeout = 15 * time.Second

// FinishCtx is the context of a delivery's final write: it survives the
// delivery's own cancellation but is still bounded.
func FinishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), FinishTimeout)
}

// Outlive returns a context for a statement that the end of ctx must not
// cut short: it ends FinishTimeout after ctx ends (or when cancel is
// called), never sooner, so a loop's statement in flight when a shutdown
// cancels the loop finishes while the shutdown waits, bounded, and a
// statement while ctx lasts has no deadline of its own. Cut short, pgx
// closes the connection in the background (a cancel request, then
// Terminate), so the statement went on running on the server after the
// shutdown returned.
func Outlive(ctx context.Context) (context.Context, context.CancelFunc) {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var (
		mu    sync.Mutex
		timer *time.Timer
		done  bool
	)
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !done {
			timer = time.AfterFunc(FinishTimeout, cancel)
		}
	})
	return out, func() {
		stop()
		mu.Lock()
		done = true
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel()
	}
}

// TxFunc is a write that joins a completion transaction.
type TxFunc = func(ctx context.Context, tx pgx.Tx) error

// Job is one leased effect to deliver.
type Job struct {
	// Fence is the lease: every write is fenced by it.
	Fence store.Fence
	// Attempt (from 1) and MaxAttempts route a failure.
	Attempt, MaxAttempts int
	// ReplaySafe is the type's replay safety (an internal job is always
	// replay-safe).
	ReplaySafe bool
	// Timeout bounds the handler.
	Timeout time.Duration
	// Handler delivers an external effect; TxHandler runs an internal job
	// inside its completion transaction. Exactly one is set.
	Handler   func(ctx context.Context) error
	TxHandler TxFunc
	// Transitions returns what the handler registered to commit with the
	// completion (Delivery.OnComplete).
	Transitions func() []TxFunc
	// HandlerDone, when set, is called once the handler has returned and
	// the completion waits for a group commit (it frees the delivery slot).
	HandlerDone func()
	// Retry, when set, records a failure instead of store.Fail: a broker
	// consumer hands the effect back to the broker. It reports whether it
	// handled the failure; found is false when the lease was lost.
	Retry func(ctx context.Context, r Route, herr error, stopping bool) (handled, found bool, err error)
}

// Op names a delivery's fenced write, in reports and errors.
type Op string

// The fenced writes of a delivery.
const (
	// OpMarkStarted commits delivery_started_at before the handler runs.
	OpMarkStarted Op = "mark started"
	// OpComplete completes the effect.
	OpComplete Op = "complete"
	// OpCommit commits a completion transaction.
	OpCommit Op = "commit"
	// OpFail records a failure (retry, dead letter, reconciliation).
	OpFail Op = "fail"
	// OpReconcile moves a delivered effect whose completion transition
	// failed to reconciliation_required.
	OpReconcile Op = "reconcile"
	// OpHandBack hands a failure back to a broker (Job.Retry).
	OpHandBack Op = "hand back"
)

// Delivered reports whether the handler's work had happened when op was
// written: a failure of such a write must not be taken for an undone
// effect.
func (op Op) Delivered() bool { return op == OpComplete || op == OpCommit || op == OpReconcile }

// Status says how a delivery ended.
type Status int

// Delivery statuses.
const (
	// Completed: the effect was completed.
	Completed Status = iota + 1
	// Failed: the failure was recorded; State is the effect's new state.
	Failed
	// LeaseLost: a fenced write matched no row; nothing was written.
	LeaseLost
	// WriteFailed: the outcome could not be written (Op says which write);
	// the lease will expire and the sweeper recover the effect.
	WriteFailed
	// Unrecorded: the completion transaction's commit failed; the lease
	// will expire and the sweeper recover the effect.
	Unrecorded
)

// Report is the end of one delivery.
type Report struct {
	Status Status
	// Outcome is the classified outcome (OutcomeLeaseLost for LeaseLost).
	Outcome Outcome
	// State is the effect's state after Failed.
	State State
	// Lag is commit → completion for Completed.
	Lag time.Duration
	// Err is the handler's (or the engine's) error.
	Err error
	// WriteErr is the error of the write that failed (WriteFailed,
	// Unrecorded).
	WriteErr error
	// Op names the fenced write.
	Op Op
	// Delay is the retry's backoff for Failed.
	Delay time.Duration
	// Reconciled: delivered, but the completion transition failed, and
	// the effect was moved to reconciliation_required.
	Reconciled bool
	// HandedBack: Job.Retry recorded the failure.
	HandedBack bool
}

// Deliverer runs deliveries: the handler with a panic guard and its
// timeout, then the classified outcome recorded, fenced by the lease.
type Deliverer struct {
	// Pool runs the engine's statements.
	Pool *pgxpool.Pool
	// Committer group-commits a completion; nil completes it in its own
	// statement.
	Committer *Committer
	// Pending, when set, counts the completions waiting for the
	// Committer (a claim loop's backpressure), and Freed is signalled
	// after each.
	Pending *atomic.Int64
	Freed   chan struct{}
	// BackoffCap caps a retry's backoff (RouteOf).
	BackoffCap time.Duration
	// Shutdown is the cancellation cause of a delivery interrupted by
	// Stop: a retry or an ambiguous outcome is then released at once.
	Shutdown error
}

// Run delivers j: an internal job runs inside its fenced completion
// transaction; a type that is not replay-safe gets delivery_started_at
// committed before its handler runs; then Settle records the outcome.
func (e *Deliverer) Run(ctx context.Context, j *Job) Report {
	if j.TxHandler != nil {
		return e.completeTx(ctx, j)
	}
	if !j.ReplaySafe {
		// The record that delivery started commits before the request is
		// sent: a crash from here on is routed to reconciliation_required.
		found, err := store.MarkStarted(ctx, e.Pool, j.Fence)
		if err != nil {
			return e.fail(ctx, j, Transient(fmt.Errorf("record delivery start: %w", err)), false)
		}
		if !found {
			return Report{Status: LeaseLost, Outcome: OutcomeLeaseLost, Op: OpMarkStarted}
		}
	}
	return e.Settle(ctx, j, e.Handle(ctx, j))
}

// Handle runs j's handler within its timeout; a panic is an error.
func (e *Deliverer) Handle(ctx context.Context, j *Job) error {
	hctx, cancel := context.WithTimeout(ctx, j.Timeout)
	defer cancel()
	return Call(hctx, j.Handler)
}

// Settle records the outcome herr of j's handler.
func (e *Deliverer) Settle(ctx context.Context, j *Job, herr error) Report {
	if herr != nil {
		return e.fail(ctx, j, herr, j.ReplaySafe)
	}
	if len(e.transitions(j)) > 0 {
		return e.completeTx(ctx, j)
	}
	if j.HandlerDone != nil {
		j.HandlerDone()
	}
	var c Committed
	if e.Committer != nil {
		c = e.commit(j.Fence)
	} else {
		fctx, cancel := FinishCtx(ctx)
		var done store.FencesCompleted
		done, c.Err = store.Complete(fctx, e.Pool, []store.Fence{j.Fence})
		cancel()
		c.Lag, c.OK = done[j.Fence]
	}
	switch {
	case c.Err != nil:
		return Report{Status: WriteFailed, Outcome: OutcomeSuccess, Op: OpComplete, WriteErr: c.Err}
	case !c.OK:
		return Report{Status: LeaseLost, Outcome: OutcomeLeaseLost, Op: OpComplete}
	}
	return Report{Status: Completed, Outcome: OutcomeSuccess, Lag: c.Lag}
}

// commit group-commits one completion, counted as pending meanwhile.
func (e *Deliverer) commit(f store.Fence) Committed {
	if e.Pending == nil {
		return e.Committer.Complete(f)
	}
	e.Pending.Add(1)
	c := e.Committer.Complete(f)
	e.Pending.Add(-1)
	Signal(e.Freed)
	return c
}

func (e *Deliverer) transitions(j *Job) []TxFunc {
	if j.Transitions == nil {
		return nil
	}
	return j.Transitions()
}

// Call runs fn, turning a panic into an error.
func Call(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return fn(ctx)
}

// completeTx completes j in its own transaction together with the internal
// job's handler or the transitions registered with the delivery: the fenced
// completion locks the row first, then their writes join it.
func (e *Deliverer) completeTx(ctx context.Context, j *Job) Report {
	job := j.TxHandler != nil
	tctx, cancel := context.WithTimeout(ctx, j.Timeout)
	defer cancel()
	if !job {
		// The external effect already happened: the completion must not
		// be cut short by the delivery's own cancellation.
		tctx, cancel = FinishCtx(ctx)
		defer cancel()
	}
	tx, err := e.Pool.Begin(tctx)
	if err != nil {
		return e.afterTxFailure(ctx, j, fmt.Errorf("begin completion: %w", err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(tctx)) }()
	done, err := store.Complete(tctx, tx, []store.Fence{j.Fence})
	if err != nil {
		return e.afterTxFailure(ctx, j, fmt.Errorf("complete: %w", err))
	}
	lag, ok := done[j.Fence]
	if !ok {
		return Report{Status: LeaseLost, Outcome: OutcomeLeaseLost, Op: OpComplete}
	}
	if job {
		if err := Call(tctx, func(ctx context.Context) error { return j.TxHandler(ctx, tx) }); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			return e.fail(ctx, j, err, true)
		}
	}
	for _, fn := range e.transitions(j) {
		if err := fn(tctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			return e.afterTxFailure(ctx, j, fmt.Errorf("completion transition: %w", err))
		}
	}
	// The commit is not cut short by the delivery's cancellation (a lease
	// extension that saw this very completion, shutdown) or the job's
	// timeout: once the fenced completion holds the row, interrupting the
	// COMMIT in flight only makes its outcome unknown, and a commit that
	// succeeded would then go unreported.
	cctx, ccancel := FinishCtx(ctx)
	defer ccancel()
	if err := tx.Commit(cctx); err != nil {
		return Report{Status: Unrecorded, Outcome: OutcomeAmbiguous, Op: OpCommit, WriteErr: fmt.Errorf("completion commit: %w", err)}
	}
	return Report{Status: Completed, Outcome: OutcomeSuccess, Lag: lag}
}

// afterTxFailure handles a completion transaction that could not commit. An
// internal job or a replay-safe effect is retried. A non-replay-safe effect
// that was delivered goes to reconciliation_required at once, fenced, with
// the transition's error, so that an operator sees it without waiting for
// the lease to expire; only when even that write fails does it keep its
// lease for the sweeper to route the same way (docs/design.md, "Delivery
// outcomes").
func (e *Deliverer) afterTxFailure(ctx context.Context, j *Job, err error) Report {
	if j.ReplaySafe || j.TxHandler != nil {
		return e.fail(ctx, j, Transient(err), true)
	}
	err = fmt.Errorf("delivered, but the completion transition failed: %w", err)
	fctx, cancel := FinishCtx(ctx)
	defer cancel()
	state, found, ferr := store.Fail(fctx, e.Pool, j.Fence, store.FailReconcile, 0, err.Error())
	switch {
	case ferr != nil:
		return Report{Status: WriteFailed, Outcome: OutcomeAmbiguous, Op: OpReconcile, Err: err, WriteErr: ferr}
	case !found:
		return Report{Status: LeaseLost, Outcome: OutcomeLeaseLost, Op: OpReconcile, Err: err}
	}
	return Report{Status: Failed, Outcome: OutcomeAmbiguous, State: State(state), Op: OpReconcile, Err: err, Reconciled: true}
}

// fail records a failed delivery with its classified outcome. A delivery
// interrupted by Stop (cause Shutdown) is released at once when it would be
// retried or is ambiguous.
func (e *Deliverer) fail(ctx context.Context, j *Job, herr error, replaySafe bool) Report {
	r := RouteOf(herr, replaySafe, j.Attempt, e.BackoffCap)
	stopping := e.Shutdown != nil && errors.Is(context.Cause(ctx), e.Shutdown)
	rep := Report{Status: Failed, Outcome: r.Outcome, Err: herr, Op: OpFail, Delay: r.Delay}
	fctx, cancel := FinishCtx(ctx)
	defer cancel()
	if j.Retry != nil {
		handled, found, err := j.Retry(fctx, r, herr, stopping)
		if handled {
			rep.Op, rep.HandedBack, rep.State = OpHandBack, true, StateLeased
			switch {
			case err != nil:
				rep.Status, rep.WriteErr = WriteFailed, err
			case !found:
				rep.Status, rep.Outcome = LeaseLost, OutcomeLeaseLost
			}
			return rep
		}
	}
	if stopping && (r.Outcome == OutcomeRetry || r.Outcome == OutcomeAmbiguous) {
		r.Kind, r.Delay = store.FailRelease, 0
		rep.Delay = 0
	}
	state, found, err := store.Fail(fctx, e.Pool, j.Fence, r.Kind, r.Delay, herr.Error())
	switch {
	case err != nil:
		rep.Status, rep.WriteErr = WriteFailed, err
	case !found:
		rep.Status, rep.Outcome = LeaseLost, OutcomeLeaseLost
	default:
		rep.State = State(state)
	}
	return rep
}
