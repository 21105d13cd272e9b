package pgoutbox

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// queueWorker is one queue's pool: a claim loop and up to Concurrency
// deliveries in flight. Queues are leased independently, so a slow or stuck
// queue never delays another.
type queueWorker struct {
	c     *Client
	name  string
	cfg   QueueConfig
	wake  chan struct{} // a NOTIFY (or catch-up) for this queue
	freed chan struct{} // a delivery finished
	// inflight packs the queue's delivery slots taken (reserve; the low 32
	// bits): the deliveries in flight, from rows and from batch pages, and
	// the slots a row claim in progress reserved, which the high 32 bits
	// count too (claimReserved), so that one load tells both.
	inflight atomic.Int64
	// slotsFreed is closed, and forgotten, when slots are released while a
	// batch page's run waits for one (waitSlot); nil when none waits.
	slotsFreed atomic.Pointer[chan struct{}]
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

	deliverer engine.Deliverer

	// batch is set when the queue's storage is batch (recordStorage, and
	// again at each sweep): its batch loop (runBatches) runs beside the row
	// claim loop, woken by batchWake. A queue of row storage whose stream
	// holds effects (switched back from batch) runs it too, until the
	// stream holds none; batchLoop is set while it runs.
	batch     atomic.Bool
	batchLoop atomic.Bool
	batchWake chan struct{}
	// runContexts counts the batch deliveries' contexts not yet cancelled
	// (each hangs on the Client's work context until it is).
	runContexts atomic.Int64
	// claimed and claimLatency are the queue's children of the Client's
	// metrics, looked up once: a batch page counts a thousand effects.
	claimed      prometheus.Counter
	claimLatency prometheus.Observer
	// spanName is its deliveries' span name, "process <queue>", made once.
	spanName string
}

func newQueueWorker(c *Client, name string, cfg QueueConfig) *queueWorker {
	q := &queueWorker{
		c: c, name: name, cfg: cfg, maxBatches: maxOpenBatches(c),
		wake:  make(chan struct{}, 1),
		freed: make(chan struct{}, 1),
		rearm: make(chan struct{}, 1),

		batchWake: make(chan struct{}, 1),

		claimed:      c.m.claimed.WithLabelValues(name),
		claimLatency: c.m.claimLatency.WithLabelValues(name),
		spanName:     "process " + name,
	}
	q.deliverer = engine.Deliverer{
		Pool: c.pool, BackoffCap: c.cfg.BackoffCap, Shutdown: errShutdown,
		Pending: &q.pending, Freed: q.freed, // Committer: set by Start
	}
	return q
}

func signal(ch chan struct{}) { engine.Signal(ch) }

// claimReserved is the unit of inflight's high half: a slot reserved by a
// row claim in progress.
const claimReserved = 1 << 32

// taken is how many of the queue's delivery slots are taken.
func (q *queueWorker) taken() int { return int(q.inflight.Load() & (claimReserved - 1)) }

// delivering is how many of the queue's effects are in flight: the slots
// taken, less those a row claim in progress reserved (a delivery the claim
// started may end before the claim returns: never below 0).
func (q *queueWorker) delivering() int {
	v := q.inflight.Load()
	return max(0, int(v&(claimReserved-1)-v/claimReserved))
}

// reserve takes up to n of the queue's Concurrency delivery slots, as many
// as are free, and returns how many it took; forClaim marks them reserved
// by a row claim in progress until claimedIn. The row claim loop reserves
// before it claims, and a batch page's run before its handler starts, so
// that the two together never deliver more than Concurrency effects of the
// queue at once.
func (q *queueWorker) reserve(n int, forClaim bool) int {
	for {
		cur := q.inflight.Load()
		got := min(int64(n), int64(q.cfg.Concurrency)-cur&(claimReserved-1))
		if got <= 0 {
			return 0
		}
		add := got
		if forClaim {
			add += got * claimReserved
		}
		if q.inflight.CompareAndSwap(cur, cur+add) {
			return int(got)
		}
	}
}

// claimedIn ends a row claim that reserved want slots and started n
// deliveries in them: the rest are released.
func (q *queueWorker) claimedIn(want, n int) {
	// One add, so that delivering never counts the released ones.
	q.inflight.Add(-int64(want)*claimReserved - int64(want-n))
	if want > n {
		q.slotsReleased()
	}
}

// release gives n delivery slots back (slotsReleased).
func (q *queueWorker) release(n int) {
	if n <= 0 {
		return
	}
	q.inflight.Add(-int64(n))
	q.slotsReleased()
}

// slotsReleased wakes whoever waits for a slot: the claim loop (freed) and
// the batch page runs in waitSlot.
func (q *queueWorker) slotsReleased() {
	signal(q.freed)
	if freed := q.slotsFreed.Swap(nil); freed != nil {
		close(*freed)
	}
}

// waitSlot takes one delivery slot for a batch page's run, waiting until
// one is released; it reports false, with none taken, when done is closed
// first.
func (q *queueWorker) waitSlot(done <-chan struct{}) bool {
	for {
		if q.reserve(1, false) == 1 {
			return true
		}
		freed := q.slotsFreed.Load()
		if freed == nil {
			ch := make(chan struct{})
			if !q.slotsFreed.CompareAndSwap(nil, &ch) {
				continue // another waiter's channel, or a release: look again
			}
			freed = &ch
		}
		// A slot released before the channel was published closed no
		// channel: try again before waiting.
		if q.reserve(1, false) == 1 {
			return true
		}
		select {
		case <-*freed:
		case <-done:
			return false
		}
	}
}

// run claims while there are free slots and claimable effects, then waits for
// a NOTIFY, a freed slot, the next due time or the poll interval (poll.go).
func (q *queueWorker) run(ctx context.Context) {
	poll := time.NewTimer(q.c.cfg.PollInterval)
	defer poll.Stop()
	// lastActive is the last wake-up or non-empty claim: for activeTail
	// after it the loop polls every activePollInterval, which picks up the
	// effects of producers whose notification the limiter folded into an
	// earlier one (migration 00005).
	var lastActive, lastClaim time.Time
	var retry claimRetry
	for {
		free := q.cfg.Concurrency - q.taken()
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
		// The slots are taken before the claim: a batch page's runs take
		// theirs meanwhile (reserve).
		if want = q.reserve(want, true); want == 0 {
			continue
		}
		lastClaim = time.Now()
		q.dueAt.Store(0) // this claim takes what is due; scheduleDue finds the rest
		n, err := q.claim(ctx, want)
		q.claimedIn(want, n)
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
		wait := q.activeWait(lastActive)
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
// It returns how many it started, each in one of the want slots the
// caller reserved.
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
			q.release(1)
		}
	}
}

// start starts the delivery of cl in a slot its claim reserved.
func (q *queueWorker) start(cl store.Claimed) {
	q.c.m.claimed.WithLabelValues(q.name).Inc()
	q.c.m.claimLatency.WithLabelValues(q.name).Observe(cl.ClaimLatency.Seconds())
	ctx, cancel := context.WithCancelCause(q.c.life.Work())
	fence := cl.Fence()
	q.c.leases.Put(&engine.Held{Fence: fence, Cancel: cancel})
	q.c.life.AddDelivery()
	go func() {
		// The slot goes back as soon as the handler has returned: the
		// completion is group-committed while the next claim runs.
		freeSlot := q.slotReleaser()
		defer func() {
			q.c.leases.Delete(fence)
			cancel(nil)
			freeSlot()
			q.c.life.DeliveryDone()
		}()
		d := newDelivery(cl)
		dctx := q.c.deliverySpan(ctx, d, cl.Traceparent)
		j := q.job(d, fence, freeSlot)
		q.report(d, q.deliverer.Run(dctx, j))
	}()
}

// newDelivery is the one mapping of a claimed row to the Delivery its
// handler sees (the Client, the manual lease API and the broker consumer).
func newDelivery(cl store.Claimed) *Delivery {
	var token string
	if cl.Token != (uuid.UUID{}) {
		token = cl.Token.String()
	}
	return deliveryOf(cl, token)
}

// deliveryOf is newDelivery with cl's lease token already formatted: a
// batch page's effects share their batch's, formatted once a page.
func deliveryOf(cl store.Claimed, token string) *Delivery {
	return &Delivery{
		ID: cl.ID, Queue: cl.Queue, Type: cl.Type, Key: cl.Key, Payload: cl.Payload,
		Attempt: cl.Attempt, MaxAttempts: cl.MaxAttempts, CreatedAt: cl.CreatedAt, OrderingKey: cl.OrderingKey,
		LeaseToken: token,
	}
}

// timeout is the delivery timeout of type t in this queue.
func (q *queueWorker) timeout(t EffectType) time.Duration {
	if t.Timeout > 0 {
		return t.Timeout
	}
	return q.cfg.DeliveryTimeout
}

// job is the core job that delivers d under fence.
func (q *queueWorker) job(d *Delivery, fence store.Fence, handlerDone func()) *engine.Job {
	t := q.c.types[d.Type]
	j := engine.JobOf(t, d, q.timeout(t))
	j.Fence, j.HandlerDone = fence, handlerDone
	return j
}

// report turns the end of a delivery into metrics, logs and events.
func (q *queueWorker) report(d *Delivery, r engine.Report) {
	outcome := r.Outcome
	switch r.Status {
	case engine.Completed:
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeSuccess)).Inc()
		q.c.m.lag.WithLabelValues(d.Queue, d.Type).Observe(r.Lag.Seconds())
		q.event(d, OutcomeSuccess, StateCompleted, nil)
	case engine.LeaseLost:
		q.leaseLost(d, r.Op)
	case engine.Unrecorded:
		engine.EndSpan(d, OutcomeSuccess, "")
		q.c.log.Error("completion commit failed; the lease will expire and the effect be recovered",
			"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", r.WriteErr)
	case engine.WriteFailed:
		switch r.Op {
		case engine.OpComplete:
			q.c.log.Error("complete failed; the lease will expire and the effect be recovered",
				"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", r.WriteErr)
			q.event(d, OutcomeSuccess, "", r.WriteErr)
		case engine.OpReconcile:
			q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeAmbiguous)).Inc()
			q.c.log.Error("delivered but the completion transition failed, and so did moving it to reconciliation_required; left for the sweeper",
				"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", r.Err, "reconcile_err", r.WriteErr)
			q.event(d, OutcomeAmbiguous, StateLeased, r.Err)
		default:
			q.c.log.Error("recording a failed delivery failed; the lease will expire and the effect be recovered",
				"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", r.WriteErr)
			q.event(d, outcome, "", r.Err)
		}
	case engine.Failed:
		q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(outcome)).Inc()
		if r.Reconciled {
			q.c.log.Error("delivered but the completion transition failed; moved to reconciliation_required",
				"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", r.Err)
			q.event(d, outcome, r.State, r.Err)
			return
		}
		if r.State == StateAvailable {
			q.noteDue(r.Delay) // wake when the retry falls due, not at the next poll
		}
		q.c.log.Warn("delivery failed", "effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type,
			"attempt", d.Attempt, "outcome", outcome, "state", r.State, "err", r.Err)
		q.event(d, outcome, r.State, r.Err)
	}
}

func (q *queueWorker) event(d *Delivery, o Outcome, state State, err error) {
	engine.EndSpan(d, o, state)
	e := Event{EffectID: d.ID, Queue: d.Queue, Type: d.Type, Attempt: d.Attempt, Outcome: o, State: state}
	if err != nil {
		e.Err = err.Error()
	}
	q.c.emit(e)
}

func (q *queueWorker) leaseLost(d *Delivery, op engine.Op) {
	q.c.log.Warn("lease lost; nothing written", "op", op, "effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type)
	q.lostUnlogged(d)
}

// lostUnlogged counts and announces a lost lease without a log line: the
// caller logged the event that lost it (a row-lock batch that did not
// commit logs one line for all its effects).
func (q *queueWorker) lostUnlogged(d *Delivery) {
	q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeLeaseLost)).Inc()
	q.event(d, OutcomeLeaseLost, "", ErrLeaseLost)
}
