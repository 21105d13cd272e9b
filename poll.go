package pgoutbox

import (
	"context"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// When a claim loop claims (docs/design.md, "Queues, claims and wake-ups"): at once while it has
// free slots and the last claim filled its batch; otherwise when the first of
// these arrives: a NOTIFY for its queue (an insert), a freed slot, the
// earliest known due time of an effect that is not yet claimable (a retry's
// backoff, a scheduled effect), or the poll interval. A failed claim is
// retried with a capped exponential backoff, logged once per outage, and the
// listener's reconnect wakes the loop at once when the database is back.

// Claim-loop timing. These are fixed, not configuration.
const (
	// activePollInterval is how often a claim loop polls while its queue is
	// active (for activeTail after a wake-up or a non-empty claim): the
	// insert trigger folds the notifications of one queue into at most one
	// per 10 ms, so a producer that skipped notifying is picked up by these
	// polls.
	activePollInterval = 5 * time.Millisecond
	// activeTail is how long a queue stays active after a wake-up or a
	// non-empty claim.
	activeTail = 250 * time.Millisecond

	// claimRetryInitial is how long a claim loop waits after a claim fails
	// (the database unreachable, a restart); each further consecutive
	// failure doubles the wait, up to claimRetryMax.
	claimRetryInitial = 100 * time.Millisecond
	// claimRetryMax caps the wait between failed claims. The listener,
	// which retries its connection every listenRetryMax at most, wakes every
	// claim loop as soon as it reconnects, so claims resume within
	// listenRetryMax of the database answering again (within claimRetryMax
	// without a listener).
	claimRetryMax = time.Second
	// listenRetryMax caps the wait between the listener's reconnection
	// attempts (from 100 ms, doubling). It is short because the listener is
	// what tells the claim loops that the database is back; an attempt
	// is one connection, and a failed one is logged only at DEBUG.
	listenRetryMax = 250 * time.Millisecond
)

// dueSlack delays a wake-up at a due time a little, so that the claim runs
// after available_at on the database clock too.
const dueSlack = 2 * time.Millisecond

// noteDue records that an effect of the queue falls due in d (on the
// database clock, measured now): the claim loop wakes then, whatever the
// poll interval. The earliest noted time wins.
func (q *queueWorker) noteDue(d time.Duration) {
	at := time.Now().Add(max(d, 0) + dueSlack).UnixNano()
	for {
		cur := q.dueAt.Load()
		if cur != 0 && cur <= at {
			return
		}
		if q.dueAt.CompareAndSwap(cur, at) {
			signal(q.rearm)
			return
		}
	}
}

// scheduleDue asks the database when the queue's next not-yet-claimable
// effect falls due, after a claim that found fewer effects than it asked for
// when the loop is about to idle for longer than activePollInterval. A failure is ignored: the poll covers it, and
// the next claim reports an outage. It does not start once ctx (the run
// context) ended, and its end does not cut it short (engine.Outlive).
func (q *queueWorker) scheduleDue(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	fctx, cancel := engine.Outlive(ctx)
	defer cancel()
	if d, ok, err := store.NextDue(fctx, q.c.pool, q.name); err == nil && ok {
		q.noteDue(d)
	}
}

// activeWait is how long an idle loop waits before it claims again: the
// poll interval, or activePollInterval for activeTail after lastActive.
func (q *queueWorker) activeWait(lastActive time.Time) time.Duration {
	if time.Since(lastActive) < activeTail {
		return min(q.c.cfg.PollInterval, activePollInterval)
	}
	return q.c.cfg.PollInterval
}

// idle waits for a NOTIFY of the queue, the earliest noted due time or wait,
// whichever comes first. woken reports a NOTIFY (or the listener's catch-up
// wake); alive is false when ctx ended.
func (q *queueWorker) idle(ctx context.Context, timer *time.Timer, wait time.Duration) (woken, alive bool) {
	for {
		d := wait
		if at := q.dueAt.Load(); at != 0 {
			d = min(d, time.Until(time.Unix(0, at)))
		}
		if d <= 0 {
			return false, true
		}
		q.c.log.Debug("claim loop idle", "queue", q.name, "wake_in", d)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false, false
		case <-q.wake:
			return true, true
		case <-timer.C:
			return false, true
		case <-q.rearm: // an earlier due time was noted
		}
	}
}

// claimRetry is a claim loop's outage state: consecutive failed claims.
type claimRetry struct {
	failures int
	since    time.Time
	next     time.Duration
}

// claimFailed logs a failed claim (the first of an outage at ERROR, the rest
// at DEBUG) and waits the backoff, or until the listener wakes the queue; it
// reports false when ctx ended.
func (q *queueWorker) claimFailed(ctx context.Context, err error, r *claimRetry) bool {
	if r.failures == 0 {
		r.since, r.next = time.Now(), claimRetryInitial
		q.c.log.Error("claim failed; retrying with backoff (logged once until a claim succeeds)",
			"queue", q.name, "err", err, "retry_in", r.next)
	} else {
		r.next = min(2*r.next, claimRetryMax)
		q.c.log.Debug("claim failed again", "queue", q.name, "err", err,
			"failures", r.failures+1, "retry_in", r.next)
	}
	r.failures++
	t := time.NewTimer(r.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-q.wake: // the listener reconnected: the database is back
	case <-t.C:
	}
	return true
}

// claimSucceeded ends an outage: one log line saying how long claims failed.
func (q *queueWorker) claimSucceeded(r *claimRetry) {
	if r.failures == 0 {
		return
	}
	q.c.log.Warn("claims resumed", "queue", q.name, "failed_claims", r.failures,
		"outage", time.Since(r.since).Round(time.Millisecond))
	*r = claimRetry{}
}
