package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Batch storage (QueueConfig.Storage, docs/batch-storage.md): a batch
// queue's effects are appended to pgoutbox.stream. Its claim loop ticks
// (closes the next batch by snapshot), leases the oldest open batch under a
// fenced token, delivers it page by page and settles each page in one
// fenced transaction. A success writes nothing of its own; the exceptions
// move to pgoutbox.effects, where the queue's row claim loop (run beside)
// delivers, retries, dead-letters and replays them as any other effect.

// recordStorage writes the storage of the queues that name one and reads
// which of the client's queues use batch storage.
func (c *Client) recordStorage(ctx context.Context) error {
	var queues, storages []string
	for _, name := range slices.Sorted(maps.Keys(c.queues)) {
		if s := c.queues[name].cfg.Storage; s != "" {
			queues, storages = append(queues, name), append(storages, string(s))
		}
	}
	if len(queues) > 0 {
		if err := store.SetStorage(ctx, c.pool, queues, storages); err != nil {
			return fmt.Errorf("pgoutbox: record the queues' storage: %w", err)
		}
	}
	rows, err := c.pool.Query(ctx, `SELECT queue FROM pgoutbox.queue_storage WHERE storage = 'batch'`)
	if err != nil {
		return fmt.Errorf("pgoutbox: read the queues' storage: %w", err)
	}
	var name string
	_, err = pgx.ForEachRow(rows, []any{&name}, func() error {
		if q, ok := c.queues[name]; ok {
			q.batch = true
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgoutbox: read the queues' storage: %w", err)
	}
	return nil
}

// runBatches is a batch queue's batch loop: claim (or tick and claim) a
// batch and deliver it; when there is none, wait for a NOTIFY or the poll
// interval (activePollInterval while the queue is active).
func (q *queueWorker) runBatches(ctx context.Context) {
	poll := time.NewTimer(q.c.cfg.PollInterval)
	defer poll.Stop()
	var lastActive time.Time
	var retry claimRetry
	for ctx.Err() == nil {
		n, err := q.nextBatch(ctx)
		if err != nil {
			if ctx.Err() != nil || !q.claimFailed(ctx, err, &retry) {
				return
			}
			continue
		}
		q.claimSucceeded(&retry)
		if n > 0 {
			lastActive = time.Now()
			continue
		}
		wait := q.c.cfg.PollInterval
		if time.Since(lastActive) < activeTail {
			wait = min(wait, activePollInterval)
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-q.batchWake:
			lastActive = time.Now()
		case <-poll.C:
		}
	}
}

// nextBatch claims the queue's oldest open batch, ticking first when there
// is none, delivers it, and returns how many effects it held (0: none).
func (q *queueWorker) nextBatch(ctx context.Context) (int, error) {
	cctx, cancel := finishCtx(ctx)
	defer cancel()
	b, ok, err := store.ClaimBatch(cctx, q.c.pool, q.name, q.c.cfg.ID, q.c.cfg.LeaseDuration)
	if err != nil {
		return 0, err
	}
	if !ok {
		ticked, err := store.Tick(cctx, q.c.pool, q.name)
		if err != nil || !ticked {
			return 0, err
		}
		if b, ok, err = store.ClaimBatch(cctx, q.c.pool, q.name, q.c.cfg.ID, q.c.cfg.LeaseDuration); err != nil || !ok {
			return 0, err
		}
	}
	return q.deliverBatch(ctx, b)
}

// deliverBatch delivers b page by page while its lease holds, extending
// the lease every LeaseDuration/3. Stop (ctx) ends it after the page in
// flight, releasing the lease so another consumer takes the batch at once.
func (q *queueWorker) deliverBatch(ctx context.Context, b store.Batch) (int, error) {
	work, cancel := context.WithCancelCause(q.c.life.Work())
	defer cancel(nil)
	extended := make(chan struct{})
	defer func() { <-extended }()
	stopExtend := make(chan struct{})
	defer close(stopExtend)
	go func() {
		defer close(extended)
		t := time.NewTicker(q.c.cfg.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-stopExtend:
				return
			case <-t.C:
				ectx, ecancel := finishCtx(work)
				ok, err := store.ExtendBatch(ectx, q.c.pool, b, q.c.cfg.LeaseDuration)
				ecancel()
				if err == nil && !ok {
					cancel(ErrLeaseLost)
					return
				}
			}
		}
	}()
	var total int
	after := b.DoneThrough
	for {
		pctx, pcancel := finishCtx(work)
		page, err := store.Page(pctx, q.c.pool, b, after, q.cfg.PageSize)
		pcancel()
		if err != nil {
			return total, err
		}
		last := len(page) < q.cfg.PageSize
		through := b.MaxID
		if !last {
			through = page[len(page)-1].ID
		}
		found, err := q.deliverPage(work, b, page, through, last)
		total += len(page)
		if err != nil || !found || last {
			return total, err
		}
		after = through
		if ctx.Err() != nil {
			rctx, rcancel := finishCtx(work)
			defer rcancel()
			_, err := store.ExtendBatch(rctx, q.c.pool, b, 0)
			return total, err
		}
	}
}

// pageRun is one effect of a page: how it ended.
type pageRun struct {
	cl    store.Claimed
	d     *Delivery
	ran   bool
	err   error // the handler's error (nil: delivered)
	move  *store.Move
	start time.Time
}

// deliverPage delivers one page of b and settles it through through (last:
// the batch is done). Effects that must not run from a batch, and those
// behind a held ordering key, move to pgoutbox.effects unrun; the others
// run, up to Concurrency at a time, the effects of one ordering key one
// after another in id order. found is false when the lease was lost.
func (q *queueWorker) deliverPage(ctx context.Context, b store.Batch, page []store.Claimed, through int64, last bool) (bool, error) {
	var keys []string
	for _, cl := range page {
		if cl.OrderingKey != "" {
			keys = append(keys, cl.OrderingKey)
		}
	}
	held := map[string]bool{}
	if len(keys) > 0 {
		hctx, cancel := finishCtx(ctx)
		var err error
		held, err = store.HeldKeys(hctx, q.c.pool, q.name, keys)
		cancel()
		if err != nil {
			return false, err
		}
	}
	// Chains: one per ordering key (its effects in id order), one per
	// unordered effect.
	runs := make([]pageRun, len(page))
	var chains [][]int
	byKey := map[string]int{}
	for i, cl := range page {
		runs[i].cl = cl
		if cl.OrderingKey == "" {
			chains = append(chains, []int{i})
			continue
		}
		c, ok := byKey[cl.OrderingKey]
		if !ok {
			c = len(chains)
			byKey[cl.OrderingKey] = c
			chains = append(chains, nil)
		}
		chains[c] = append(chains[c], i)
	}
	slots := make(chan struct{}, q.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, chain := range chains {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			blocked := held[runs[chain[0]].cl.OrderingKey]
			for _, i := range chain {
				r := &runs[i]
				if blocked || !q.runsFromBatch(r.cl) {
					r.move = &store.Move{Effect: r.cl, State: string(StateAvailable)}
					blocked = r.cl.OrderingKey != ""
					continue
				}
				q.runOne(ctx, r)
				if r.move != nil && r.cl.OrderingKey != "" {
					blocked = true
				}
			}
		}()
	}
	wg.Wait()

	var moves []store.Move
	var done []store.Completion
	for i := range runs {
		r := &runs[i]
		if r.move != nil {
			moves = append(moves, *r.move)
		} else if fns := engine.Transitions(r.d); len(fns) > 0 {
			done = append(done, store.Completion{Effect: r.cl, Fns: fns})
		}
	}
	sctx, cancel := finishCtx(ctx)
	defer cancel()
	var transitionFailed map[int64]error
	found, err := store.Settle(sctx, q.c.pool, b, through, last, moves, q.c.cfg.ID, done,
		func(cl store.Claimed, err error) store.Move {
			if transitionFailed == nil {
				transitionFailed = map[int64]error{}
			}
			transitionFailed[cl.ID] = err
			return q.failedMove(cl, engine.Retry(fmt.Errorf("completion transition: %w", err)))
		})
	q.reportPage(runs, found, err, transitionFailed)
	return found, err
}

// runsFromBatch reports whether cl may be delivered from its batch: a
// registered, replay-safe type with a plain handler, due now.
func (q *queueWorker) runsFromBatch(cl store.Claimed) bool {
	t, ok := q.c.types[cl.Type]
	return ok && t.ReplaySafe && t.Handler != nil && t.TxHandler == nil && cl.ClaimLatency >= 0
}

// runOne delivers r's effect (its first attempt) and routes a failure to
// its move.
func (q *queueWorker) runOne(ctx context.Context, r *pageRun) {
	q.c.m.claimed.WithLabelValues(q.name).Inc()
	q.c.m.claimLatency.WithLabelValues(q.name).Observe(r.cl.ClaimLatency.Seconds())
	r.d, r.ran, r.start = newDelivery(r.cl), true, time.Now()
	dctx := q.c.deliverySpan(ctx, r.d, r.cl.Traceparent)
	t := q.c.types[r.cl.Type]
	j := engine.JobOf(t, r.d, q.timeout(t))
	if r.err = q.deliverer.Handle(dctx, j); r.err != nil {
		m := q.failedMove(r.cl, r.err)
		if errors.Is(context.Cause(ctx), errShutdown) && m.State == string(StateAvailable) {
			m.Delay = 0 // interrupted by Stop: released at once
		}
		r.move = &m
	}
}

// failedMove is where a failed first attempt of cl goes: back to available
// after its backoff, or to dead_letter (a permanent failure, or no
// attempts left). Every type run from a batch is replay-safe.
func (q *queueWorker) failedMove(cl store.Claimed, herr error) store.Move {
	route := engine.RouteOf(herr, true, 1, q.c.cfg.BackoffCap)
	m := store.Move{Effect: cl, State: string(StateAvailable), Attempts: 1, Delay: route.Delay, Error: herr.Error()}
	if route.Kind == store.FailDeadLetter || cl.MaxAttempts <= 1 {
		m.State, m.Delay = string(StateDeadLetter), 0
	}
	return m
}

// reportPage turns a settled page into metrics, logs and events.
func (q *queueWorker) reportPage(runs []pageRun, found bool, err error, transitionFailed map[int64]error) {
	for i := range runs {
		r := &runs[i]
		if !r.ran {
			continue
		}
		d := r.d
		switch {
		case err != nil:
			engine.EndSpan(d, OutcomeSuccess, "")
			q.c.log.Error("settling a batch page failed; the batch lease will expire and the page be delivered again",
				"effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type, "err", err)
		case !found:
			q.lostUnlogged(d)
		case r.move == nil && transitionFailed[d.ID] == nil:
			q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeSuccess)).Inc()
			q.c.m.lag.WithLabelValues(d.Queue, d.Type).Observe((r.cl.ClaimLatency + time.Since(r.start)).Seconds())
			q.event(d, OutcomeSuccess, StateCompleted, nil)
		default:
			herr := r.err
			if herr == nil {
				herr = transitionFailed[d.ID]
			}
			outcome, _ := engine.Classify(herr, true)
			state := StateAvailable
			if r.move != nil && r.move.State == string(StateDeadLetter) {
				state = StateDeadLetter
			}
			q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(outcome)).Inc()
			q.c.log.Warn("delivery failed", "effect_id", d.ID, "queue", d.Queue, "effect_type", d.Type,
				"attempt", d.Attempt, "outcome", outcome, "state", state, "err", herr)
			q.event(d, outcome, state, herr)
		}
	}
	if err == nil && !found {
		q.c.log.Warn("batch lease lost; nothing written", "queue", q.name)
	}
}
