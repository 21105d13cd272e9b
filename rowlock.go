package pgoutbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Row-lock leases (QueueConfig.RowLockLease).
//
// A queue in this mode claims with a SELECT … FOR UPDATE SKIP LOCKED inside a
// transaction it keeps open, and writes nothing at claim: the row lock is the
// lease, and no other claimer, sweeper or operator command can move a locked
// row. The replay-safe effects of the batch are delivered while the
// transaction is open; the batch closes when all of them have returned or
// when RowLockLease has passed, whichever comes first. Closing is one round
// trip (store.CloseLocked): an UPDATE completes every effect whose handler
// succeeded (available → completed, one tuple write over the effect's whole
// delivery, where a durable lease costs two), another promotes every other
// row of the batch (a handler still running, a failure, a success with
// OnComplete transitions, a type that may not run under a row lock) to an
// ordinary durable lease, the batch's record is deleted, and the
// transaction commits. The claim is one round trip too (BEGIN and the
// SELECT, store.BeginLockClaim). From there those effects follow the durable
// path (fenced completion, failure routing, lease extension, sweeper).
//
// The fence is the lock itself: the completion runs in the transaction that
// holds it, so if the lock was lost (connection or server gone, the server's
// idle-in-transaction timeout) the commit fails and nothing is written; the
// effects are still available and will be delivered again (at-least-once,
// which is why only replay-safe types run under a row lock).
//
// A worker that dies during the hold (a crash, an OOM kill, a handler that
// exits the process) writes nothing, so no attempt is counted for the
// effects it held. Left at that, a poison effect that kills its worker
// would crash-loop the queue forever, available with attempts = 0 at the
// head of the claim order. So the batch leaves a trace that survives its
// worker: before delivering anything it records the ids it locked
// (store.RecordLockClaim: one row of pgoutbox.lock_claims, committed on a
// second pool connection with asynchronous commit, so a worker's crash
// cannot lose it) and deletes the record in the transaction that closes
// it. A claim that locks a row which a surviving record names (its batch
// no longer holds the row, so it died), a row that still carries a dead
// claimer's lock in its xmax, or one attempted before, reports it as
// suspect, and the batch promotes it instead of delivering it under the
// lock: it is delivered under a durable lease, which counts the attempt,
// so a poison is counted from its second crash on and dead-lettered after
// MaxAttempts like under durable leases (at most MaxAttempts+1 crashes),
// whatever vacuum did to the rows meanwhile: xmax alone is erased by
// VACUUM (FREEZE), any vacuum with vacuum_freeze_min_age = 0 and
// PostgreSQL 16's opportunistic freezing; the record is in a table vacuum
// never changes the meaning of. Client.Prune deletes the records of dead
// batches once none of their effects is available with no attempt.
//
// The two connections of a claim are taken before it locks anything
// (acquireClaimPair, which says why). The record costs a batch one round
// trip before its deliveries start; its delete rides in the close's round
// trip, and the claim's BEGIN and the close's COMMIT ride in theirs, so a
// batch takes three round trips. A retry, a released or recovered
// effect takes a durable lease (two writes instead of one).

// lockBatch is one open claim transaction of a queue in row-lock mode.
type lockBatch struct {
	q      *queueWorker
	conn   *pgxpool.Conn // holds the claim transaction (store.BeginLockClaim)
	record int64         // the batch's pgoutbox.lock_claims row (store.RecordLockClaim)
	timer  *time.Timer

	mu      sync.Mutex
	pending int             // in-transaction deliveries still running, +1 while starting
	closing bool            // close has begun: nothing more joins done
	done    []*Delivery     // succeeded: completed by the closing UPDATE
	promote []int64         // to become durable leases at close
	running map[int64]*inTx // in-transaction deliveries whose handler has not returned
	waiting []store.Claimed // rows that may not run under a row lock, delivered after close
	closed  chan struct{}   // closed once the close committed or failed
	leases  map[int64]store.Claimed
	lost    bool // the close did not commit (set before closed is closed)
}

// inTx is one in-transaction delivery.
type inTx struct {
	d      *Delivery
	cancel context.CancelCauseFunc
}

// rowLockable reports whether an effect of type name may be delivered under
// a row lock: a registered, replay-safe, external (non-Tx) handler, or a
// PageHandler (called with that one delivery).
func (q *queueWorker) rowLockable(name string) (EffectType, bool) {
	t, ok := q.c.types[name]
	return t, ok && t.ReplaySafe && engine.External(t)
}

// maxOpenBatches bounds the claim transactions a queue keeps open, each
// holding a pool connection: half the pool, at least one. (pgxpool's
// Config() copies the whole configuration, so this runs once per queue.)
func maxOpenBatches(c *Client) int64 {
	return max(1, int64(c.pool.Config().MaxConns)/2)
}

// acquireClaimPair takes the two pool connections a row-lock claim needs:
// conn for the claim transaction, rec for the batch's record
// (store.RecordLockClaim), which commits on its own. Both are taken before
// any row is locked. Taking rec after the claim deadlocked: the claim's
// SELECT … FOR UPDATE keeps the lock of a row it re-checked and dropped (a
// row another batch's close had just leased), and that lease's own
// statements (MarkStarted, Complete) wait for the lock, each holding a pool
// connection, while the claim transaction waited for a free one: with the
// pool full of them, nothing moved until the server ended the claim
// transaction at its idle-in-transaction timeout (LeaseDuration), by which
// time the leases waiting on it had lapsed (issue 28, point 3). One claim
// loop of the Client at a time waits with one connection in hand (claimMu):
// several, each holding one and waiting for a second, could fill the pool.
func (c *Client) acquireClaimPair(ctx context.Context) (conn, rec *pgxpool.Conn, err error) {
	c.claimMu.Lock()
	defer c.claimMu.Unlock()
	if conn, err = c.pool.Acquire(ctx); err != nil {
		return nil, nil, err
	}
	if rec, err = c.pool.Acquire(ctx); err != nil {
		conn.Release()
		return nil, nil, err
	}
	return conn, rec, nil
}

// lockClaim claims up to want effects in a new row-lock batch and starts
// their deliveries. It returns how many rows it locked. Its statements run
// under cctx, which Stop does not cancel; a batch locked after Stop began
// (ctx done) is rolled back at once, which releases its rows untouched.
func (q *queueWorker) lockClaim(ctx, cctx context.Context, want int) (int, error) {
	conn, rec, err := q.c.acquireClaimPair(cctx)
	if err != nil {
		return 0, err
	}
	claimed, err := store.BeginLockClaim(cctx, conn, q.name, want, q.c.cfg.LeaseDuration)
	if err == nil && len(claimed) > 0 && ctx.Err() != nil {
		claimed, err = nil, ctx.Err()
	}
	if err != nil || len(claimed) == 0 {
		rec.Release()
		rollbackLocked(cctx, conn)
		return 0, err
	}
	ids := make([]int64, len(claimed))
	for i, cl := range claimed {
		ids[i] = cl.ID
	}
	record, crashed, err := store.RecordLockClaim(cctx, rec, q.name, ids)
	rec.Release()
	if err != nil {
		rollbackLocked(cctx, conn)
		return 0, err
	}
	for i := range claimed {
		if slices.Contains(crashed, claimed[i].ID) {
			claimed[i].Suspect = true
		}
	}
	b := &lockBatch{
		q: q, conn: conn, record: record, pending: 1,
		running: make(map[int64]*inTx, len(claimed)),
		closed:  make(chan struct{}),
	}
	q.openBatches.Add(1)
	q.c.life.AddDelivery() // the batch itself: Stop waits for its close
	// The row has no lease token: the claim transaction's row lock is the
	// lease, and this UUID names it (Delivery.LeaseToken).
	token := uuid.NewString()
	b.mu.Lock()
	for _, cl := range claimed {
		t, ok := q.rowLockable(cl.Type)
		if !ok || cl.Suspect {
			b.waiting = append(b.waiting, cl)
			b.promote = append(b.promote, cl.ID)
			continue
		}
		q.c.m.claimed.WithLabelValues(q.name).Inc()
		q.c.m.claimLatency.WithLabelValues(q.name).Observe(cl.ClaimLatency.Seconds())
		dctx, cancel := context.WithCancelCause(q.c.life.Work())
		it := &inTx{d: newDelivery(cl), cancel: cancel}
		it.d.LeaseToken = token
		dctx = q.c.deliverySpan(dctx, it.d, cl.Traceparent)
		b.running[cl.ID] = it
		b.pending++
		q.c.life.AddDelivery()
		go b.deliver(dctx, cl, t, it)
	}
	b.timer = time.AfterFunc(q.cfg.RowLockLease, b.close)
	b.mu.Unlock()
	b.release()
	return len(claimed), nil
}

// rollbackLocked ends a claim transaction that will not commit and gives
// its connection back (a connection left in a transaction, or broken, is
// closed by the pool instead of reused).
func rollbackLocked(ctx context.Context, conn *pgxpool.Conn) {
	_ = store.RollbackLocked(ctx, conn)
	conn.Release()
}

// release drops one pending count and closes the batch when it was the last.
func (b *lockBatch) release() {
	b.mu.Lock()
	b.pending--
	last := b.pending == 0 && !b.closing
	b.mu.Unlock()
	if last {
		b.close()
	}
}

func (b *lockBatch) deliver(ctx context.Context, cl store.Claimed, t EffectType, it *inTx) {
	q := b.q
	defer q.c.life.DeliveryDone()
	defer it.cancel(nil)
	freeSlot := q.slotReleaser()
	defer freeSlot()
	j := engine.JobOf(t, it.d, q.timeout(t))
	err := q.deliverer.Handle(ctx, j)
	b.mu.Lock()
	delete(b.running, cl.ID)
	if !b.closing {
		if err == nil && len(engine.Transitions(it.d)) == 0 {
			b.done = append(b.done, it.d)
			b.mu.Unlock()
			freeSlot()
			b.release()
			return
		}
		b.promote = append(b.promote, cl.ID)
	}
	b.mu.Unlock()
	b.release()
	// A failure, a success with transitions, or a handler that outlived the
	// hold: it continues under the durable lease the close gave it.
	<-b.closed
	lease, ok := b.leases[cl.ID]
	if !ok && b.lost {
		q.lostUnlogged(it.d) // the batch's line said it
		return
	}
	if !ok {
		q.leaseLost(it.d, "row-lock lease")
		return
	}
	it.d.Attempt, it.d.LeaseToken = lease.Attempt, lease.Token.String()
	j.Fence = store.Fence{ID: cl.ID, Token: lease.Token, Type: cl.Type}
	j.Attempt, j.HandlerDone = lease.Attempt, freeSlot
	q.c.leases.Put(&engine.Held{Fence: j.Fence, Cancel: it.cancel})
	defer q.c.leases.Delete(j.Fence)
	q.report(it.d, q.deliverer.Settle(ctx, j, err))
}

// close completes the succeeded effects, promotes every other row of the
// batch to a durable lease, and commits; it runs once.
func (b *lockBatch) close() {
	q := b.q
	b.mu.Lock()
	if b.closing {
		b.mu.Unlock()
		return
	}
	b.closing = true
	b.timer.Stop()
	done, promote := b.done, b.promote
	for id := range b.running {
		promote = append(promote, id)
	}
	b.mu.Unlock()

	ctx, cancel := finishCtx(q.c.life.Work())
	defer cancel()
	ids := make([]int64, len(done))
	for i, d := range done {
		ids[i] = d.ID
	}
	completed, leases, err := store.CloseLocked(ctx, b.conn, true, b.record, ids, promote, q.c.cfg.ID, q.c.cfg.LeaseDuration)
	if err != nil {
		rollbackLocked(ctx, b.conn)
	} else {
		b.conn.Release()
	}
	if err != nil {
		// One line for the batch: its effects' lost leases are the
		// documented at-least-once path, not one fault each.
		q.c.log.Warn("row-lock batch did not commit; its effects stay available and will be delivered again",
			"queue", q.name, "effects", len(done)+len(promote), "err", err)
		completed, leases = nil, nil
		b.lost = true
	}
	b.leases = make(map[int64]store.Claimed, len(leases))
	for _, l := range leases {
		b.leases[l.ID] = l
	}
	b.mu.Lock()
	for id, it := range b.running {
		if l, ok := b.leases[id]; ok {
			// Still running: extended with the other durable leases from now on.
			q.c.leases.Put(&engine.Held{Fence: store.Fence{ID: id, Token: l.Token, Type: it.d.Type}, Cancel: it.cancel})
		} else {
			it.cancel(ErrLeaseLost)
		}
	}
	b.mu.Unlock()
	close(b.closed)

	for _, d := range done {
		// A batch that did not commit lost its locks, i.e. its leases.
		if lag, ok := completed[d.ID]; ok {
			q.report(d, engine.Report{Status: engine.Completed, Outcome: engine.OutcomeSuccess, Lag: lag})
		} else if b.lost {
			q.lostUnlogged(d)
		} else {
			q.leaseLost(d, "complete")
		}
	}
	for _, cl := range b.waiting {
		if l, ok := b.leases[cl.ID]; ok {
			q.start(l) // in the slot its claim reserved
		} else {
			q.release(1)
		}
	}
	q.openBatches.Add(-1)
	signal(q.freed)
	q.c.life.DeliveryDone()
}
