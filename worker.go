package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// queueWorker is one queue's pool: a claim loop and up to Concurrency
// deliveries in flight. Queues are leased independently, so a slow or stuck
// queue never delays another.
type queueWorker struct {
	c        *Client
	name     string
	cfg      QueueConfig
	wake     chan struct{} // a NOTIFY (or catch-up) for this queue
	freed    chan struct{} // a delivery finished
	inflight atomic.Int64
	// pending counts completions handed to the group committer and not yet
	// written.
	pending atomic.Int64
	// openBatches counts open row-lock claim transactions (RowLockLease),
	// at most maxBatches.
	openBatches atomic.Int64
	maxBatches  int64
	// dueAt is the earliest known time (Unix ns, 0: none) an effect of the
	// queue falls due; rearm tells an idle claim loop it moved (poll.go).
	dueAt atomic.Int64
	rearm chan struct{}

	mu   sync.Mutex
	held map[int64]*held
}

// held is an in-flight lease.
type held struct {
	fence  store.Fence
	cancel context.CancelCauseFunc
}

func newQueueWorker(c *Client, name string, cfg QueueConfig) *queueWorker {
	return &queueWorker{
		c: c, name: name, cfg: cfg, maxBatches: maxOpenBatches(c),
		wake:  make(chan struct{}, 1),
		freed: make(chan struct{}, 1),
		rearm: make(chan struct{}, 1),
		held:  map[int64]*held{},
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run claims while there are free slots and claimable effects, then waits for
// a NOTIFY, a freed slot, the next due time or the poll interval (poll.go).
func (q *queueWorker) run(ctx context.Context) {
	defer q.c.runWG.Done()
	poll := time.NewTimer(q.c.cfg.PollInterval)
	defer poll.Stop()
	// lastActive is the last wake-up or non-empty claim: for activeTail
	// after it the loop polls every activePollInterval, which picks up the
	// effects of producers whose notification the limiter folded into an
	// earlier one (migration 00005).
	var lastActive, lastClaim time.Time
	var retry claimRetry
	for {
		free := q.cfg.Concurrency - int(q.inflight.Load())
		// Backpressure: a slot is freed when its handler returns, before its
		// completion is committed, so claims overlap group commits; but no
		// more than Concurrency completions may wait, or a slow commit
		// would let leases pile up (and their extension grow) unbounded.
		if over := int(q.pending.Load()) - q.cfg.Concurrency; over > 0 {
			free -= over
		}
		// No free slot, or no room for another row-lock batch.
		if free <= 0 || (q.cfg.RowLockLease > 0 && q.openBatches.Load() >= q.maxBatches) {
			if !q.waitFreed(ctx, 0) {
				return
			}
			continue
		}
		want := min(free, q.cfg.ClaimBatch)
		if rest := q.cooldownLeft(want, lastClaim); rest > 0 {
			if !q.waitFreed(ctx, rest) {
				return
			}
			continue
		}
		lastClaim = time.Now()
		q.dueAt.Store(0) // this claim takes what is due; scheduleDue finds the rest
		n, err := q.claim(ctx, want)
		if err != nil {
			if ctx.Err() != nil || !q.claimFailed(ctx, err, &retry) {
				return
			}
			continue
		}
		q.claimSucceeded(&retry)
		if n > 0 {
			lastActive = time.Now()
		}
		if n == want {
			continue // a full batch: there may be more
		}
		wait := q.c.cfg.PollInterval
		if time.Since(lastActive) < activeTail {
			wait = min(wait, activePollInterval)
		}
		if wait > activePollInterval {
			// About to idle: learn when the next retry or scheduled
			// effect falls due. (A busy queue polls every
			// activePollInterval anyway and pays no extra query.)
			q.scheduleDue(ctx)
		}
		woken, alive := q.idle(ctx, poll, wait)
		if !alive {
			return
		}
		if woken {
			lastActive = time.Now()
		}
	}
}

// cooldownLeft is how long the claim loop should still wait before claiming
// want effects, the previous claim having started at last: zero unless the
// queue has a ClaimCooldown and want is a partial batch.
func (q *queueWorker) cooldownLeft(want int, last time.Time) time.Duration {
	if q.cfg.ClaimCooldown <= 0 || want >= min(q.cfg.Concurrency, q.cfg.ClaimBatch) {
		return 0
	}
	return q.cfg.ClaimCooldown - time.Since(last)
}

// waitFreed waits for a delivery slot to be freed, or at most d when d is
// positive; it reports false when ctx ends first.
func (q *queueWorker) waitFreed(ctx context.Context, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-q.freed:
	case <-timeout:
	}
	return true
}

// claim claims up to want effects and starts their deliveries: under
// durable leases, or in a row-lock batch when the queue has RowLockLease.
//
// A claim that has begun is not interrupted by Stop (ctx, the run context):
// its statements run under a finish context. Cut short, pgx closes the
// connection in the background, so a row-lock claim transaction stayed
// open on the server after Stop returned, and a durable claim could commit
// leases that no one delivers until they expire.
func (q *queueWorker) claim(ctx context.Context, want int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	cctx, cancel := finishCtx(ctx)
	defer cancel()
	if q.cfg.RowLockLease > 0 {
		return q.lockClaim(ctx, cctx, want)
	}
	claimed, err := store.Claim(cctx, q.c.pool, q.name, q.c.cfg.ID, want, q.c.cfg.LeaseDuration)
	for _, cl := range claimed {
		q.start(cl)
	}
	return len(claimed), err
}

// slotReleaser returns a function that gives one delivery slot back to the
// claim loop the first time it is called and does nothing after.
func (q *queueWorker) slotReleaser() func() {
	var freed bool
	return func() {
		if !freed {
			freed = true
			q.inflight.Add(-1)
			signal(q.freed)
		}
	}
}

func (q *queueWorker) start(cl store.Claimed) {
	q.c.m.claimed.WithLabelValues(q.name).Inc()
	q.c.m.claimLatency.WithLabelValues(q.name).Observe(cl.ClaimLatency.Seconds())
	ctx, cancel := context.WithCancelCause(q.c.workCtx)
	h := &held{fence: store.Fence{ID: cl.ID, Token: cl.Token, Type: cl.Type}, cancel: cancel}
	q.mu.Lock()
	q.held[cl.ID] = h
	q.mu.Unlock()
	q.inflight.Add(1)
	q.c.deliveries.Add(1)
	go func() {
		// The slot goes back as soon as the handler has returned: the
		// completion is group-committed while the next claim runs.
		freeSlot := q.slotReleaser()
		defer func() {
			q.mu.Lock()
			delete(q.held, cl.ID)
			q.mu.Unlock()
			cancel(nil)
			freeSlot()
			q.c.deliveries.Done()
		}()
		q.deliver(ctx, cl, h.fence, freeSlot)
	}()
}

func newDelivery(cl store.Claimed) *Delivery {
	d := &Delivery{
		ID: cl.ID, Queue: cl.Queue, Type: cl.Type, Key: cl.Key, Payload: cl.Payload,
		Attempt: cl.Attempt, MaxAttempts: cl.MaxAttempts, CreatedAt: cl.CreatedAt,
	}
	if cl.Token != (uuid.UUID{}) {
		d.LeaseToken = cl.Token.String()
	}
	return d
}

// timeout is the delivery timeout of type t in this queue.
func (q *queueWorker) timeout(t EffectType) time.Duration {
	if t.Timeout > 0 {
		return t.Timeout
	}
	return q.cfg.DeliveryTimeout
}

func (q *queueWorker) deliver(ctx context.Context, cl store.Claimed, fence store.Fence, handlerDone func()) {
	d := newDelivery(cl)
	t, ok := q.c.types[cl.Type]
	if !ok {
		q.fail(ctx, d, fence, true, Retry(fmt.Errorf("no handler registered for effect type %q", cl.Type)))
		return
	}
	if t.TxHandler != nil {
		q.runTx(ctx, d, fence, t, q.timeout(t))
		return
	}
	if !t.ReplaySafe {
		// The record that delivery started commits before the request is
		// sent: a crash from here on is routed to reconciliation_required.
		found, err := store.MarkStarted(ctx, q.c.pool, fence)
		if err != nil || !found {
			if err == nil {
				err = ErrLeaseLost
			}
			q.fail(ctx, d, fence, false, Retry(fmt.Errorf("record delivery start: %w", err)))
			return
		}
	}
	q.settle(ctx, d, fence, t, q.handle(ctx, t, d), handlerDone)
}

// handle runs t's handler for d within the type's delivery timeout.
func (q *queueWorker) handle(ctx context.Context, t EffectType, d *Delivery) error {
	hctx, hcancel := context.WithTimeout(ctx, q.timeout(t))
	defer hcancel()
	return call(hctx, func(ctx context.Context) error { return t.Handler(ctx, d) })
}

// settle writes the outcome of a handler that ran under a durable lease.
func (q *queueWorker) settle(ctx context.Context, d *Delivery, fence store.Fence, t EffectType, err error, handlerDone func()) {
	if err != nil {
		q.fail(ctx, d, fence, t.ReplaySafe, err)
		return
	}
	if len(d.onComplete) == 0 {
		handlerDone()
		q.completeBatched(ctx, d, fence)
		return
	}
	q.completeTx(ctx, d, fence, t.ReplaySafe, nil, q.timeout(t))
}

// call runs fn, turning a panic into an error.
func call(ctx context.Context, fn func(context.Context) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panic: %v", r)
		}
	}()
	return fn(ctx)
}

func (q *queueWorker) completeBatched(ctx context.Context, d *Delivery, fence store.Fence) {
	done := make(chan completeRes, 1)
	q.pending.Add(1)
	q.c.completions <- completeReq{fence: fence, done: done}
	res := <-done
	q.pending.Add(-1)
	signal(q.freed)
	q.recordCompletion(ctx, d, res.ok, res.lag, res.err)
}

func (q *queueWorker) recordCompletion(ctx context.Context, d *Delivery, ok bool, lag time.Duration, err error) {
	switch {
	case err != nil:
		q.c.log.Error("complete failed; the lease will expire and the effect be recovered",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err)
		q.event(d, OutcomeSuccess, "", err)
	case !ok:
		q.leaseLost(d, "complete")
	default:
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeSuccess)).Inc()
		q.c.m.lag.WithLabelValues(d.Queue, d.Type).Observe(lag.Seconds())
		q.event(d, OutcomeSuccess, "completed", nil)
	}
}

func (q *queueWorker) event(d *Delivery, o Outcome, state string, err error) {
	e := Event{EffectID: d.ID, Queue: d.Queue, Type: d.Type, Attempt: d.Attempt, Outcome: o, State: State(state)}
	if err != nil {
		e.Err = err.Error()
	}
	q.c.emit(e)
}

func (q *queueWorker) leaseLost(d *Delivery, op string) {
	q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeLeaseLost)).Inc()
	q.c.log.Warn("lease lost; nothing written", "op", op, "effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type)
	q.event(d, OutcomeLeaseLost, "", ErrLeaseLost)
}

// runTx runs an internal job inside its completion transaction: the fenced
// completion locks the row first, then the handler's writes join it.
func (q *queueWorker) runTx(ctx context.Context, d *Delivery, fence store.Fence, t EffectType, timeout time.Duration) {
	q.completeTx(ctx, d, fence, true, t.TxHandler, timeout)
}

// completeTx completes one effect in its own transaction together with the
// job's handler (internal jobs) and the transitions registered with
// OnComplete.
func (q *queueWorker) completeTx(ctx context.Context, d *Delivery, fence store.Fence, replaySafe bool, job TxHandler, timeout time.Duration) {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if job == nil {
		// The external effect already happened: the completion must not
		// be cut short by the delivery's own cancellation.
		tctx, cancel = finishCtx(ctx)
		defer cancel()
	}
	tx, err := q.c.pool.Begin(tctx)
	if err != nil {
		q.afterTxFailure(ctx, d, fence, replaySafe, job != nil, fmt.Errorf("begin completion: %w", err))
		return
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(tctx)) }()
	done, err := store.Complete(tctx, tx, []store.Fence{fence})
	if err != nil {
		q.afterTxFailure(ctx, d, fence, replaySafe, job != nil, fmt.Errorf("complete: %w", err))
		return
	}
	lag, ok := done[fence.ID]
	if !ok {
		q.leaseLost(d, "complete")
		return
	}
	if job != nil {
		if err := call(tctx, func(ctx context.Context) error { return job(ctx, tx, d) }); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			q.fail(ctx, d, fence, true, err)
			return
		}
	}
	for _, fn := range d.onComplete {
		if err := fn(tctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			q.afterTxFailure(ctx, d, fence, replaySafe, job != nil, fmt.Errorf("completion transition: %w", err))
			return
		}
	}
	// The commit is not cut short by the delivery's cancellation (a lease
	// extension that saw this very completion, shutdown) or the job's
	// timeout: once the fenced completion holds the row, interrupting the
	// COMMIT in flight only makes its outcome unknown, and a commit that
	// succeeded would then go unreported.
	cctx, ccancel := finishCtx(ctx)
	defer ccancel()
	if err := tx.Commit(cctx); err != nil {
		q.c.log.Error("completion commit failed; the lease will expire and the effect be recovered",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err)
		return
	}
	q.recordCompletion(ctx, d, true, lag, nil)
}

// afterTxFailure handles a completion transaction that could not commit. An
// internal job or a replay-safe effect is retried. A non-replay-safe effect
// that was delivered goes to reconciliation_required at once, fenced, with
// the transition's error, so that an operator sees it without waiting for
// the lease to expire; only when even that write fails does it keep its
// lease for the sweeper to route the same way (docs/design.md, "Delivery
// outcomes").
func (q *queueWorker) afterTxFailure(ctx context.Context, d *Delivery, fence store.Fence, replaySafe, job bool, err error) {
	if replaySafe || job {
		q.fail(ctx, d, fence, true, Retry(err))
		return
	}
	err = fmt.Errorf("delivered, but the completion transition failed: %w", err)
	fctx, cancel := finishCtx(ctx)
	defer cancel()
	state, found, ferr := store.Fail(fctx, q.c.pool, fence, store.FailReconcile, 0, err.Error())
	switch {
	case ferr != nil:
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeAmbiguous)).Inc()
		q.c.log.Error("delivered but the completion transition failed, and so did moving it to reconciliation_required; left for the sweeper",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err, "reconcile_err", ferr)
		q.event(d, OutcomeAmbiguous, "leased", err)
	case !found:
		q.leaseLost(d, "reconcile")
	default:
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeAmbiguous)).Inc()
		q.c.log.Error("delivered but the completion transition failed; moved to reconciliation_required",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err)
		q.event(d, OutcomeAmbiguous, state, err)
	}
}

// fail records a failed delivery with its classified outcome.
func (q *queueWorker) fail(ctx context.Context, d *Delivery, fence store.Fence, replaySafe bool, herr error) {
	outcome, _ := classify(herr, replaySafe)
	kind, delay := failRoute(herr, replaySafe, d.Attempt, q.c.cfg.BackoffCap)
	if errors.Is(context.Cause(ctx), errShutdown) && (outcome == OutcomeRetry || outcome == OutcomeAmbiguous) {
		kind, delay = store.FailRelease, 0
	}
	fctx, cancel := finishCtx(ctx)
	defer cancel()
	state, found, err := store.Fail(fctx, q.c.pool, fence, kind, delay, herr.Error())
	switch {
	case err != nil:
		q.c.log.Error("recording a failed delivery failed; the lease will expire and the effect be recovered",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err)
		q.event(d, outcome, "", herr)
	case !found:
		q.leaseLost(d, "fail")
	default:
		if state == "available" {
			q.noteDue(delay) // wake when the retry falls due, not at the next poll
		}
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(outcome)).Inc()
		q.c.log.Warn("delivery failed", "effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type,
			"attempt", d.Attempt, "outcome", outcome, "state", state, "err", herr)
		q.event(d, outcome, state, herr)
	}
}
