package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

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

// SetStorage records queue's storage in the database, as a Client whose
// QueueConfig names one does when it starts: for a program that enqueues
// before any such Client of the queue has started (until then its effects
// go to the row storage, where a batch queue's Client still delivers
// them). It changes nothing already enqueued: a queue switched back to
// StorageRows is still delivered from its stream until the stream holds
// none of its effects, its ordered effects in rows claimed only behind the
// stream's (migration 00034), and running Clients read the new storage at
// their next sweep.
func SetStorage(ctx context.Context, db DB, queue string, s Storage) error {
	if queue == "" || (s != StorageRows && s != StorageBatch) {
		return fmt.Errorf("pgoutbox: SetStorage(%q, %q): want a queue and %q or %q", queue, s, StorageRows, StorageBatch)
	}
	if err := store.SetStorage(ctx, db, []string{queue}, []string{string(s)}, nil); err != nil {
		return fmt.Errorf("pgoutbox: record the storage of queue %q: %w", queue, err)
	}
	return nil
}

// recordStorage writes the storage of the queues that name one and reads
// which of the client's queues use batch storage (readStorage): it returns
// the queues whose batch loop should run.
func (c *Client) recordStorage(ctx context.Context) ([]*queueWorker, error) {
	names := slices.Sorted(maps.Keys(c.queues))
	var queues, storages []string
	var lanes []int32
	for _, name := range names {
		if s := c.queues[name].cfg.Storage; s != "" {
			queues, storages = append(queues, name), append(storages, string(s))
			lanes = append(lanes, int32(c.queues[name].cfg.Lanes))
		}
	}
	if len(queues) > 0 {
		if err := store.SetStorage(ctx, c.pool, queues, storages, lanes); err != nil {
			return nil, fmt.Errorf("pgoutbox: record the queues' storage: %w", err)
		}
	}
	return c.readStorage(ctx)
}

// readStorage reads which of the client's queues use batch storage and
// which have effects in the stream, and returns the queues whose batch
// loop should run and does not.
func (c *Client) readStorage(ctx context.Context) ([]*queueWorker, error) {
	names := slices.Sorted(maps.Keys(c.queues))
	streams, err := store.QueueStreams(ctx, c.pool, names)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: read the queues' storage: %w", err)
	}
	var start []*queueWorker
	for _, name := range names {
		q, s := c.queues[name], streams[name]
		q.batch.Store(s.Batch)
		if (s.Batch || s.Stream) && !q.batchLoop.Load() {
			start = append(start, q)
		}
	}
	return start, nil
}

// startBatches starts the batch loop of each of qs that runs none.
func (c *Client) startBatches(qs []*queueWorker) {
	for _, q := range qs {
		if q.batchLoop.CompareAndSwap(false, true) {
			c.life.Go(func(ctx context.Context) {
				defer q.batchLoop.Store(false)
				q.runBatches(ctx)
			})
		}
	}
}

// refreshStorage reads the queues' storage again (a queue switched by
// SetStorage while the client runs) and starts the batch loops it needs.
func (c *Client) refreshStorage(p pass) error {
	start, err := stmt(p, c.readStorage)
	if err == nil && p.ctx.Err() == nil {
		c.startBatches(start)
	}
	return err
}

// runBatches is a batch queue's batch loop: claim (or tick and claim) a
// batch and deliver it; when there is none, wait for a NOTIFY or the poll
// interval (activePollInterval while the queue is active). A queue of row
// storage with effects in the stream (drain) runs it until the stream has
// none of its effects left: their batches settled and rotated out.
func (q *queueWorker) runBatches(ctx context.Context) {
	poll := time.NewTimer(q.c.cfg.PollInterval)
	defer poll.Stop()
	var lastActive time.Time
	var retry claimRetry
	for ctx.Err() == nil {
		switch n, err := q.nextBatch(ctx); {
		case err != nil:
			if ctx.Err() != nil || !q.claimFailed(ctx, err, &retry) {
				return
			}
			continue
		case n > 0:
			q.claimSucceeded(&retry)
			lastActive = time.Now()
			continue
		}
		q.claimSucceeded(&retry)
		if !q.batch.Load() && !q.streamLeft(ctx) {
			return
		}
		wait := q.activeWait(lastActive)
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

// streamLeft reports whether the queue has effects in the stream (true
// when that cannot be read: the loop goes on).
func (q *queueWorker) streamLeft(ctx context.Context) bool {
	cctx, cancel := finishCtx(ctx)
	defer cancel()
	s, err := store.QueueStreams(cctx, q.c.pool, []string{q.name})
	return err != nil || s[q.name].Stream
}

// tickTimeout bounds a tick (store.Tick), which reads every row committed
// since the previous one: a large backlog's first tick is long.
const tickTimeout = 10 * time.Minute

// nextBatch claims the queue's oldest open batch, ticking first when there
// is none, delivers it, and returns how many effects it held (0: none).
func (q *queueWorker) nextBatch(ctx context.Context) (int, error) {
	claim := func() (store.Batch, bool, error) {
		cctx, cancel := finishCtx(ctx)
		defer cancel()
		return store.ClaimBatch(cctx, q.c.pool, q.name, q.c.cfg.ID, q.c.cfg.LeaseDuration)
	}
	b, ok, err := claim()
	if err != nil {
		return 0, err
	}
	if !ok {
		// A tick reads every row committed since the previous one: the
		// first tick of a 10M backlog took minutes on a loaded machine, and
		// under the 15 s of a claim it timed out and started over, again and
		// again. Stop still cancels it.
		tctx, tcancel := context.WithTimeout(ctx, tickTimeout)
		_, err := store.Tick(tctx, q.c.pool, q.name)
		tcancel()
		if err != nil {
			return 0, err
		}
		// Claimed even when this tick closed nothing: another consumer's
		// tick, which this one waited for, may have closed the rows into
		// one batch per lane and taken only one of them.
		if b, ok, err = claim(); err != nil || !ok {
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
	// The next page is read while this one is delivered: reading is
	// PostgreSQL's work, delivering the Client's.
	type read struct {
		page []store.Claimed
		err  error
	}
	readPage := func(after int64) <-chan read {
		out := make(chan read, 1)
		go func() {
			pctx, pcancel := finishCtx(work)
			defer pcancel()
			page, err := store.Page(pctx, q.c.pool, b, after, q.cfg.PageSize)
			out <- read{page, err}
		}()
		return out
	}
	next := readPage(b.DoneThrough)
	pool := &runPool{q: q, tasks: make(chan *pageWork)}
	defer pool.close()
	for {
		r := <-next
		page, err := r.page, r.err
		if err != nil {
			return total, err
		}
		last := len(page) < q.cfg.PageSize
		through := b.MaxID
		if !last {
			through = page[len(page)-1].ID
			next = readPage(through)
		}
		found, err := q.deliverPage(work, pool, b, page, through, last)
		total += len(page)
		if err != nil || !found || last {
			if !last {
				<-next // its connection back to the pool before the batch ends
			}
			return total, err
		}
		if ctx.Err() != nil {
			<-next
			rctx, rcancel := finishCtx(work)
			defer rcancel()
			return total, store.ReleaseBatch(rctx, q.c.pool, b)
		}
	}
}

// pageRun is one effect of a page: how it ended. The page's mutex guards
// every field once the runs start.
type pageRun struct {
	cl      store.Claimed
	d       *Delivery
	job     *engine.Job
	ran     bool  // its handler was started
	done    bool  // its handler returned
	err     error // the handler's error (nil: delivered)
	move    *store.Move
	start   time.Time
	runCtx  context.Context
	cancel  context.CancelCauseFunc
	promote *store.Move // set when the page was settled while it ran
}

// unrun moves r's effect to pgoutbox.effects without running it.
func (r *pageRun) unrun() { r.move = &store.Move{Effect: r.cl, State: string(StateAvailable)} }

// pageState is what the runs of a page share; mu guards it and every run.
type pageState struct {
	mu   sync.Mutex
	runs []pageRun
	held map[string]bool // ordering keys held in pgoutbox.effects
	cut  bool            // the page was settled: start nothing more
	// cutDone is closed when cut is set: a run waiting for a slot gives up.
	cutDone chan struct{}
	// lost is set when the batch's lease was lost while the page ran: its
	// running runs were cancelled, and no run starts any more.
	lost  bool
	found bool // the settle matched the lease (read after settled)
	// settled is closed once the page's settle has returned.
	settled chan struct{}
	// token is the batch's lease token as its runs' Delivery.LeaseToken.
	token string
}

// runPool runs the effects of a batch's pages on an elastic pool of
// workers that lives as long as the batch. A page is offered to the pool
// (pageWork); its workers take its runs one by one from a shared index,
// so that handing an effect to a worker costs an atomic add, not a
// channel send and a goroutine's wake-up. A page wakes idle workers, or
// starts new ones up to Concurrency, as many as it has runs; a worker
// whose page has no run left joins the newest page before it idles. Fast
// handlers thus keep few workers busy for a page, slow ones up to
// Concurrency. A goroutine per effect, each growing its stack and
// contending for its page's mutex, cost more than the handlers of a page
// of no-op deliveries; a channel send per effect still cost a fifth of
// the Client's CPU in a drain.
type runPool struct {
	q       *queueWorker
	tasks   chan *pageWork
	newest  atomic.Pointer[pageWork] // the page offered last
	workers atomic.Int64             // started
}

// pageWork is a page's runs to start, in id order, as the pool's workers
// take them.
type pageWork struct {
	p *pageState
	// order is the runs to start, in id order: a run's index in p.runs, or
	// -1-g for groups[g], the runs of a PageHandler's type, started
	// together where the first of them is.
	order  []int
	groups [][]int
	next   atomic.Int64 // the index in order of the next run to take
	left   sync.WaitGroup
	// taken is closed once every run was taken (or cut): offering the
	// page to more workers is moot.
	taken     chan struct{}
	takenOnce sync.Once
}

func newPageWork(p *pageState, order []int, groups [][]int) *pageWork {
	w := &pageWork{p: p, order: order, groups: groups, taken: make(chan struct{})}
	w.left.Add(len(order))
	return w
}

// take returns the next run of w to start; false when none is left.
func (w *pageWork) take() (int, bool) {
	i := w.next.Add(1) - 1
	if i >= int64(len(w.order)) {
		w.takenOnce.Do(func() { close(w.taken) })
		return 0, false
	}
	return w.order[i], true
}

// hasRuns reports whether a run of w is still to be taken.
func (w *pageWork) hasRuns() bool { return w.next.Load() < int64(len(w.order)) }

// cut takes every run of w not taken yet and counts it as ended: the page
// was cut, and they move unrun. No worker takes a run of w afterwards.
func (w *pageWork) cut() {
	n := int64(len(w.order))
	for i := w.next.Swap(n); i < n; i++ {
		w.left.Done()
	}
	w.takenOnce.Do(func() { close(w.taken) })
}

// runs runs w's runs until none is left to take.
func (c *runPool) runs(w *pageWork) {
	for {
		i, ok := w.take()
		if !ok {
			return
		}
		if i < 0 {
			c.q.runGroup(w.p, w.groups[-1-i])
		} else {
			c.q.runOne(w.p, i)
		}
		w.left.Done()
	}
}

func (c *runPool) work(w *pageWork) {
	for ok := true; ok; w, ok = <-c.tasks {
		for w != nil {
			c.runs(w)
			// The newest page may have been offered while this worker
			// was busy and found no idle one.
			if n := c.newest.Load(); n != w && n != nil && n.hasRuns() {
				w = n
				continue
			}
			w = nil
		}
	}
}

// offer hands w to the pool's workers: idle ones, else new ones up to
// Concurrency, one per run at most. When every worker is busy, it waits
// until one takes w, or w has no run left to take, or the page settled.
func (c *runPool) offer(w *pageWork) {
	c.newest.Store(w)
	for range min(len(w.order), c.q.cfg.Concurrency) {
		if !w.hasRuns() {
			return
		}
		select {
		case c.tasks <- w:
			continue
		default:
		}
		if c.workers.Add(1) <= int64(c.q.cfg.Concurrency) {
			go c.work(w)
			continue
		}
		c.workers.Add(-1)
		// Every worker is busy: the first free one takes w here, or joins
		// it as the newest page.
		select {
		case c.tasks <- w:
		case <-w.taken:
		case <-w.p.settled:
		}
		return
	}
}

// close lets the idle workers end; the busy ones end after their run.
// No page may be offered any more.
func (c *runPool) close() { close(c.tasks) }

// deliverPage delivers one page of b and settles it through through (last:
// the batch is done). Effects that must not run from a batch, and those
// behind a held ordering key, and an ordering key's effects after its
// first, move to pgoutbox.effects unrun; the others run, up to Concurrency
// at a time. The page waits for its handlers at most
// PageHold: the ones still running then are promoted to durable leases in
// pgoutbox.effects (as a row-lock batch promotes its slow effects), the
// ones not started yet move there unrun, and the page settles at once, so
// a slow handler holds its batch, and the queue, for PageHold at most. A
// promoted delivery completes or fails in pgoutbox.effects under its own
// lease. found is false when the lease was lost.
func (q *queueWorker) deliverPage(ctx context.Context, pool *runPool, b store.Batch, page []store.Claimed, through int64,
	last bool) (bool, error) {
	if b.Relet {
		// The batch's former holder let its lease expire unsettled: it may
		// have died delivering one of these. Each moves to the row storage,
		// where a durable lease counts every attempt, so an effect that
		// kills its consumer is dead-lettered after max_attempts, as in the
		// row storage. The effects that may have run from the batch (the
		// first of each ordering key) have that attempt recorded, but none
		// is dead-lettered here: whether it was called is not known, and
		// an effect with max_attempts 1 would be dead-lettered uncalled;
		// replay-safe, it may rather be called once more.
		moves := make([]store.Move, len(page))
		first := firstOfKeys(page)
		for i, cl := range page {
			moves[i] = store.Move{Effect: cl, State: string(StateAvailable)}
			if !q.runsFromBatch(cl) || !first[i] {
				continue // never run from a batch
			}
			moves[i].Attempts = 1
			moves[i].Error = "the batch lease expired before this page was settled; delivered again under a durable lease"
		}
		sctx, cancel := finishCtx(ctx)
		defer cancel()
		return store.Settle(sctx, q.c.pool, b, q.c.cfg.ID, store.PageSettle{Through: through, Last: last, Moves: moves,
			Passed: store.PassedTypes(page)}, nil)
	}
	p := &pageState{runs: make([]pageRun, len(page)), held: map[string]bool{}, settled: make(chan struct{}),
		cutDone: make(chan struct{}), token: b.Token.String()}
	var keys []string
	for _, cl := range page {
		if cl.OrderingKey != "" {
			keys = append(keys, cl.OrderingKey)
		}
	}
	if len(keys) > 0 {
		hctx, cancel := finishCtx(ctx)
		var err error
		p.held, err = store.HeldKeys(hctx, q.c.pool, q.name, keys)
		cancel()
		if err != nil {
			return false, err
		}
	}
	// Of an ordering key's effects only the first runs from the batch; the
	// later ones move to pgoutbox.effects unrun, behind it, when the page
	// settles, and the row storage delivers them one after another. A
	// page's outcomes are written only when it settles: had it run a key's
	// effects one after another, a consumer dying before the settle would
	// have them all delivered again after the later ones succeeded, where
	// the ordering guarantee repeats only a key's head (test/reliability's
	// ordering checker found it).
	runs := p.runs
	var order []int // the runs to start, in id order
	// A PageHandler's type runs as one group: its place in order is its
	// first run's.
	var groups [][]int
	group := map[string]int{}
	first := firstOfKeys(page)
	for i, cl := range page {
		runs[i].cl = cl
		if !first[i] {
			runs[i].unrun()
			continue
		}
		if t := q.c.types[cl.Type]; t.PageHandler != nil {
			g, ok := group[cl.Type]
			if !ok {
				g = len(groups)
				group[cl.Type] = g
				groups = append(groups, nil)
				order = append(order, -1-g)
			}
			groups[g] = append(groups[g], i)
			continue
		}
		order = append(order, i)
	}
	w := newPageWork(p, order, groups)
	// A lost batch lease (deliverBatch's extender cancels ctx with
	// ErrLeaseLost) cancels the runs still running from the batch, as a
	// lost lease cancels a delivery in the row storage: another consumer
	// took the batch over and delivers them again. A promoted run has a
	// durable lease of its own and goes on.
	stopLost := context.AfterFunc(ctx, func() {
		if !errors.Is(context.Cause(ctx), ErrLeaseLost) {
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.lost = true
		for i := range runs {
			if r := &runs[i]; r.ran && !r.done && r.promote == nil {
				r.cancel(ErrLeaseLost)
			}
		}
	})
	defer stopLost()
	// Stop waits for the page's runs, promoted ones included.
	q.c.life.AddDelivery()
	allDone, offered := make(chan struct{}), make(chan struct{})
	go func() {
		defer q.c.life.DeliveryDone()
		w.left.Wait()
		close(allDone)
	}()
	go func() {
		defer close(offered)
		pool.offer(w)
	}()
	// The pool outlives the page: the page is not offered after it
	// returns.
	defer func() { <-offered }()
	hold := time.NewTimer(q.cfg.PageHold)
	defer hold.Stop()
	select {
	case <-allDone:
	case <-hold.C:
	}

	// The cut: what ran has its outcome, what runs is promoted, what did
	// not start moves unrun.
	p.mu.Lock()
	p.cut = true
	close(p.cutDone)
	var moves []store.Move
	var done []store.Completion
	var promoted []*pageRun
	for i := range runs {
		r := &runs[i]
		switch {
		case !r.ran && r.move == nil:
			r.unrun()
			moves = append(moves, *r.move)
		case r.ran && !r.done:
			m := store.Move{Effect: r.cl, State: string(StateLeased), Attempts: 1, Token: uuid.New(),
				Lease: q.c.cfg.LeaseDuration}
			r.promote = &m
			moves = append(moves, m)
			promoted = append(promoted, r)
		case r.move != nil:
			moves = append(moves, *r.move)
		default:
			if fns := engine.Transitions(r.d); len(fns) > 0 {
				done = append(done, store.Completion{Effect: r.cl, Fns: fns})
			}
		}
	}
	completed := pageCompletions(runs, time.Now())
	p.mu.Unlock()
	w.cut() // no run of the page starts any more

	sctx, cancel := finishCtx(ctx)
	defer cancel()
	var transitionFailed map[int64]error
	found, err := store.Settle(sctx, q.c.pool, b, q.c.cfg.ID,
		store.PageSettle{Through: through, Last: last, Moves: moves, Done: done, Completed: completed,
			Passed: store.PassedTypes(page)},
		func(cl store.Claimed, err error) store.Move {
			if transitionFailed == nil {
				transitionFailed = map[int64]error{}
			}
			transitionFailed[cl.ID] = err
			return q.failedMove(cl, engine.Retry(fmt.Errorf("completion transition: %w", err)))
		})
	p.mu.Lock()
	p.found = found && err == nil
	if p.found {
		// The promoted deliveries' leases exist now: extend them with the
		// Client's other leases.
		for _, r := range promoted {
			if !r.done {
				q.c.leases.Put(&engine.Held{Fence: r.promotedFence(), Cancel: r.cancel})
			}
		}
	}
	p.mu.Unlock()
	close(p.settled)
	q.reportPage(runs, found, err, transitionFailed)
	return found, err
}

// pageCompletions counts the effects of runs delivered from the batch
// (ran, returned, no move, not promoted), per type, with the median and
// 99th percentile of their lag from creation to now, the page's settle:
// what `status` shows of a batch queue's completions.
func pageCompletions(runs []pageRun, now time.Time) []store.PageCompleted {
	lags := map[string][]float64{}
	for i := range runs {
		r := &runs[i]
		if r.ran && r.done && r.move == nil && r.promote == nil {
			lags[r.cl.Type] = append(lags[r.cl.Type], now.Sub(r.cl.CreatedAt).Seconds())
		}
	}
	out := make([]store.PageCompleted, 0, len(lags))
	for _, typ := range slices.Sorted(maps.Keys(lags)) {
		l := lags[typ]
		slices.Sort(l)
		rank := func(q float64) float64 { return l[int(math.Ceil(q*float64(len(l))))-1] }
		out = append(out, store.PageCompleted{Type: typ, Count: int64(len(l)), LagP50: rank(0.5), LagP99: rank(0.99)})
	}
	return out
}

// firstOfKeys reports, for each effect of a page (in id order), whether
// it may run from the batch as far as ordering goes: it has no ordering
// key, or it is its key's first in the page.
func firstOfKeys(page []store.Claimed) []bool {
	out := make([]bool, len(page))
	seen := map[string]bool{}
	for i, cl := range page {
		out[i] = cl.OrderingKey == "" || !seen[cl.OrderingKey]
		if cl.OrderingKey != "" {
			seen[cl.OrderingKey] = true
		}
	}
	return out
}

// runOne runs the effect of p's run i unless the page was cut or it must
// not run from the batch (then it moves to pgoutbox.effects unrun); a
// promoted delivery is finished in the row storage once the page settled.
func (q *queueWorker) runOne(p *pageState, i int) {
	r := &p.runs[i]
	p.mu.Lock()
	if p.cut || p.lost {
		p.mu.Unlock()
		return
	}
	if p.held[r.cl.OrderingKey] || !q.runsFromBatch(r.cl) {
		r.unrun()
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	if !q.runSlot(p) {
		return
	}
	defer q.release(1)
	q.prepareRun(r, p.token)
	p.mu.Unlock()
	herr := q.deliverer.Handle(r.runCtx, r.job)
	p.mu.Lock()
	r.done, r.err = true, herr
	if r.promote == nil {
		if herr != nil {
			m := q.failedMove(r.cl, herr)
			if errors.Is(context.Cause(r.runCtx), errShutdown) && m.State == string(StateAvailable) {
				m.Delay = 0 // interrupted by Stop: released at once
			}
			r.move = &m
		}
		// Its context hangs on the Client's work context until cancelled:
		// a context per delivered effect grew the worker by about 1 KB an
		// effect.
		q.endRun(r)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	<-p.settled
	p.mu.Lock()
	found := p.found
	p.mu.Unlock()
	q.finishPromoted(r, herr, found)
}

// runSlot takes one of the queue's Concurrency slots for a run of p, which
// the row claim loop's deliveries (the exceptions) take too, and returns
// with p locked. It waits for a slot at most until the page is cut (its
// runs not started then move unrun), and reports false, with no slot
// taken and p unlocked, when the page was cut or its lease lost first.
func (q *queueWorker) runSlot(p *pageState) bool {
	if !q.waitSlot(p.cutDone) {
		return false
	}
	p.mu.Lock()
	if p.cut || p.lost {
		p.mu.Unlock()
		q.release(1)
		return false
	}
	return true
}

// runGroup runs the effects of p's runs idx, a PageHandler's type's, in
// one call, unless the page was cut: those that must not run from the
// batch move unrun, as in runOne. The call holds one delivery slot and
// runs under one context, which each run's cancel cancels: a lost batch
// lease, or a lost durable lease of a promoted run, ends the call. Each
// run then ends as runOne's would with its own error.
func (q *queueWorker) runGroup(p *pageState, idx []int) {
	p.mu.Lock()
	if p.cut || p.lost {
		p.mu.Unlock()
		return
	}
	var live []int
	for _, i := range idx {
		if r := &p.runs[i]; p.held[r.cl.OrderingKey] || !q.runsFromBatch(r.cl) {
			r.unrun()
			continue
		}
		live = append(live, i)
	}
	p.mu.Unlock()
	if len(live) == 0 || !q.runSlot(p) {
		return
	}
	defer q.release(1)
	t := q.c.types[p.runs[live[0]].cl.Type]
	ds := make([]*Delivery, len(live))
	traceparents := make([]string, len(live))
	// Each run's cancel is the call's (endRun, a lost lease).
	first := &p.runs[live[0]]
	var ctx context.Context
	ctx, first.cancel = context.WithCancelCause(q.c.life.Work())
	cancel := first.cancel
	q.runContexts.Add(int64(len(live)))
	start := time.Now()
	q.claimed.Add(float64(len(live)))
	for k, i := range live {
		r := &p.runs[i]
		q.claimLatency.Observe(r.cl.ClaimLatency.Seconds())
		r.d, r.ran, r.start = deliveryOf(r.cl, p.token), true, start
		r.runCtx, r.cancel = ctx, cancel
		ds[k], traceparents[k] = r.d, r.cl.Traceparent
	}
	p.mu.Unlock()
	ctx, span := q.c.pageSpan(ctx, q.name, t.Name, ds, traceparents)
	hctx, hcancel := context.WithTimeout(ctx, q.timeout(t))
	var errs []error
	called := engine.Call(hctx, func(ctx context.Context) error {
		errs = t.PageHandler(ctx, ds)
		return nil
	})
	hcancel()
	errs = engine.PageErrors(errs, called, len(ds))
	endPageSpan(span, errs)
	var promoted []int
	p.mu.Lock()
	for k, i := range live {
		r := &p.runs[i]
		r.done, r.err = true, errs[k]
		if r.promote != nil {
			promoted = append(promoted, i)
			continue
		}
		if r.err != nil {
			m := q.failedMove(r.cl, r.err)
			if errors.Is(context.Cause(ctx), errShutdown) && m.State == string(StateAvailable) {
				m.Delay = 0 // interrupted by Stop: released at once
			}
			r.move = &m
		}
		q.endRun(r)
	}
	p.mu.Unlock()
	if len(promoted) == 0 {
		return
	}
	<-p.settled
	p.mu.Lock()
	found := p.found
	p.mu.Unlock()
	for _, i := range promoted {
		r := &p.runs[i]
		r.job = engine.JobOf(t, r.d, q.timeout(t))
		q.finishPromoted(r, r.err, found)
	}
}

// runsFromBatch reports whether cl may be delivered from its batch: a
// registered, replay-safe type with a Handler or a PageHandler, due now.
func (q *queueWorker) runsFromBatch(cl store.Claimed) bool {
	t, ok := q.c.types[cl.Type]
	return ok && t.ReplaySafe && engine.External(t) && cl.ClaimLatency >= 0
}

// prepareRun readies r's delivery (its first attempt): its Delivery (with
// token, the batch's lease token), its span, its job fenced by the durable
// lease it gets if it is promoted, and its own context, which a lost
// promoted lease cancels.
func (q *queueWorker) prepareRun(r *pageRun, token string) {
	q.claimed.Inc()
	q.claimLatency.Observe(r.cl.ClaimLatency.Seconds())
	r.d, r.ran, r.start = deliveryOf(r.cl, token), true, time.Now()
	var ctx context.Context
	ctx, r.cancel = context.WithCancelCause(q.c.life.Work())
	q.runContexts.Add(1)
	ctx = q.c.deliverySpan(ctx, r.d, r.cl.Traceparent)
	t := q.c.types[r.cl.Type]
	r.job = engine.JobOf(t, r.d, q.timeout(t))
	r.runCtx = ctx
}

// endRun cancels r's context once its run ended: in runOne, or in
// finishPromoted for a promoted run (a lost lease may have cancelled it
// before).
func (q *queueWorker) endRun(r *pageRun) {
	r.cancel(nil)
	q.runContexts.Add(-1)
}

// promotedFence is the durable lease r was promoted to.
func (r *pageRun) promotedFence() store.Fence {
	return store.Fence{ID: r.cl.ID, Token: r.promote.Token, Type: r.cl.Type}
}

// finishPromoted records the outcome herr of a promoted delivery under its
// durable lease, once its page settled (found: the page's settle moved it).
func (q *queueWorker) finishPromoted(r *pageRun, herr error, found bool) {
	defer q.endRun(r)
	if !found {
		return // reportPage counted it with its page
	}
	defer q.c.leases.Delete(r.promotedFence())
	r.job.Fence = r.promotedFence()
	q.report(r.d, q.deliverer.Settle(q.c.life.Work(), r.job, herr))
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
	type successMetrics struct {
		delivered prometheus.Counter
		lag       prometheus.Observer
	}
	success := map[string]successMetrics{} // by effect type, looked up once a page
	for i := range runs {
		r := &runs[i]
		if !r.ran || (r.promote != nil && found && err == nil) {
			continue // not delivered, or finished under its durable lease (finishPromoted)
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
			m, ok := success[d.Type]
			if !ok {
				m = successMetrics{q.c.m.deliveries.WithLabelValues(d.Queue, d.Type, string(OutcomeSuccess)),
					q.c.m.lag.WithLabelValues(d.Queue, d.Type)}
				success[d.Type] = m
			}
			m.delivered.Inc()
			m.lag.Observe((r.cl.ClaimLatency + time.Since(r.start)).Seconds())
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
