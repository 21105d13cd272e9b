package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// errShutdown is the cancellation cause of deliveries still running when
// Stop's deadline passes.
var errShutdown = errors.New("pgoutbox: client stopped before delivery finished")

// Client runs the worker pools of its queues, the lease extender, the
// completion group-committer, the LISTEN/NOTIFY listener and the maintenance
// loop (sweeper and retention pruning). Several Clients, in one process or
// many, may work the same database and queues.
type Client struct {
	pool  *pgxpool.Pool
	cfg   Config
	log   *slog.Logger
	m     *metrics
	types map[string]EffectType

	queues map[string]*queueWorker
	subs   subscribers

	mu      sync.Mutex
	started bool
	stopped bool

	runCancel   context.CancelFunc      // producers, listener, maintenance
	workCancel  context.CancelCauseFunc // every delivery's context (hard stop)
	extCancel   context.CancelFunc      // the lease extender
	runWG       sync.WaitGroup          // producers, listener, maintenance
	extWG       sync.WaitGroup          // extender
	deliveries  sync.WaitGroup          // in-flight deliveries
	completions chan completeReq        // to the group committer
	complWG     sync.WaitGroup          // group committers
	workCtx     context.Context         // parent of deliveries
}

// NewClient validates cfg and returns a Client that is not yet started.
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, errors.New("pgoutbox: NewClient: pool is nil")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{
		pool:   pool,
		cfg:    cfg,
		log:    cfg.Logger,
		m:      newMetrics(cfg.Registerer),
		types:  make(map[string]EffectType, len(cfg.Types)),
		queues: make(map[string]*queueWorker, len(cfg.Queues)),
	}
	for _, t := range cfg.Types {
		if t.TxHandler != nil {
			t.ReplaySafe = true // its writes commit with its completion or not at all
		}
		c.types[t.Name] = t
	}
	for name, qc := range cfg.Queues {
		c.queues[name] = newQueueWorker(c, name, qc)
	}
	return c, nil
}

// ID returns the worker identity written to lease_owner.
func (c *Client) ID() string { return c.cfg.ID }

// Start launches the client's goroutines and returns. ctx is used only for
// start-up; the client runs until Stop. A client with queues first checks
// whether its pool goes through a transaction-pooling proxy
// (docs/poolers.md): if so, Start fails when the pool's query mode needs
// named prepared statements (ErrPreparedStatementsThroughPooler), and without
// Config.SessionURL the claim loops poll instead of listening, which Start
// logs once at WARN. Start fails when Config.SessionURL is not a session.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return errors.New("pgoutbox: client already started")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var listenCfg *pgx.ConnConfig
	if len(c.queues) > 0 {
		var err error
		if listenCfg, err = c.checkPooler(ctx); err != nil {
			return err
		}
	}
	if err := c.registerOrdering(ctx); err != nil {
		return err
	}
	c.started = true

	runCtx, runCancel := context.WithCancel(context.Background())
	workCtx, workCancel := context.WithCancelCause(context.Background())
	extCtx, extCancel := context.WithCancel(context.Background())
	c.runCancel, c.workCancel, c.extCancel, c.workCtx = runCancel, workCancel, extCancel, workCtx

	c.completions = make(chan completeReq, c.cfg.CompletionBatch)
	for range 2 {
		c.complWG.Add(1)
		go c.groupCommit()
	}
	if len(c.queues) > 0 {
		c.extWG.Add(1)
		go c.extendLoop(extCtx)
		if listenCfg != nil {
			c.runWG.Add(1)
			go c.listen(runCtx, listenCfg)
		}
	}
	for _, q := range c.queues {
		c.runWG.Add(1)
		go q.run(runCtx)
	}
	c.runWG.Add(1)
	go c.maintain(runCtx)
	c.log.Info("pgoutbox client started", "id", c.cfg.ID, "queues", len(c.queues))
	return nil
}

// Stop stops claiming, lets in-flight deliveries finish until ctx ends, then
// cancels the rest; an interrupted replay-safe effect is released to
// available, an interrupted non-replay-safe one whose delivery started goes
// to reconciliation_required. Stop returns when every goroutine has exited.
// Handlers must honour their context.
func (c *Client) Stop(ctx context.Context) error {
	c.mu.Lock()
	if !c.started || c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()

	c.runCancel()
	c.runWG.Wait()

	done := make(chan struct{})
	go func() { c.deliveries.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		c.workCancel(errShutdown)
		<-done
		err = fmt.Errorf("pgoutbox: stop deadline passed, in-flight deliveries were interrupted: %w", ctx.Err())
	}
	c.workCancel(nil)
	c.extCancel()
	c.extWG.Wait()
	close(c.completions)
	c.complWG.Wait()
	c.log.Info("pgoutbox client stopped", "id", c.cfg.ID)
	return err
}

// finishCtx is the context of a delivery's final write: it survives the
// delivery's own cancellation but is still bounded.
func finishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
}

// Sweep recovers expired leases once (the maintenance loop does this every
// SweepInterval) and returns how many it moved.
func (c *Client) Sweep(ctx context.Context) (int, error) {
	total := 0
	for {
		rescued, err := store.Sweep(ctx, c.pool, c.cfg.SweepBatch, 0)
		if err != nil {
			return total, fmt.Errorf("pgoutbox: sweep: %w", err)
		}
		for _, r := range rescued {
			if q := c.queues[r.Queue]; q != nil && r.State == "available" {
				signal(q.wake) // claimable now: no need to wait for the poll
			}
			c.m.rescued.WithLabelValues(r.Queue, r.Type, r.State).Inc()
			c.log.Warn("recovered expired lease", "effect_id", r.ID, "queue", r.Queue, "effect_type", r.Type, "state", r.State)
		}
		total += len(rescued)
		if len(rescued) < c.cfg.SweepBatch {
			return total, nil
		}
	}
}

// Prune deletes completed effects older than CompletedRetention in batches of
// PruneBatch and returns how many it deleted; then it deletes, in batches of
// PruneBatch too, the idempotency keys older than KeyRetention whose effect
// is gone (not counted in the result).
func (c *Client) Prune(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, err := store.Prune(ctx, c.pool, c.cfg.CompletedRetention, c.cfg.PruneBatch)
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune: %w", err)
		}
		total += n
		if n < int64(c.cfg.PruneBatch) {
			break
		}
	}
	for {
		n, err := store.PruneKeys(ctx, c.pool, c.cfg.KeyRetention, c.cfg.PruneBatch)
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune keys: %w", err)
		}
		if n < int64(c.cfg.PruneBatch) {
			return total, nil
		}
	}
}

func (c *Client) maintain(ctx context.Context) {
	defer c.runWG.Done()
	tick := func(d time.Duration) <-chan time.Time {
		if d < 0 {
			return nil
		}
		return time.NewTicker(d).C
	}
	sweep, prune := tick(c.cfg.SweepInterval), tick(c.cfg.PruneInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep:
			if _, err := c.Sweep(ctx); err != nil && ctx.Err() == nil {
				c.log.Error("sweep failed", "err", err)
			}
		case <-prune:
			if _, err := c.Prune(ctx); err != nil && ctx.Err() == nil {
				c.log.Error("prune failed", "err", err)
			}
		}
	}
}

// extendLoop extends every in-flight lease in one statement per LeaseDuration/3,
// and cancels deliveries whose lease was lost.
func (c *Client) extendLoop(ctx context.Context) {
	defer c.extWG.Done()
	t := time.NewTicker(c.cfg.LeaseDuration / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.ExtendLeases(ctx)
		}
	}
}

// ExtendLeases extends the leases of every in-flight delivery now (the
// extender does this every LeaseDuration/3) and cancels, with cause
// ErrLeaseLost, the deliveries whose lease was lost.
func (c *Client) ExtendLeases(ctx context.Context) {
	var fences []store.Fence
	var holders []*held
	for _, q := range c.queues {
		q.mu.Lock()
		for _, h := range q.held {
			fences = append(fences, h.fence)
			holders = append(holders, h)
		}
		q.mu.Unlock()
	}
	if len(fences) == 0 {
		return
	}
	kept, err := store.Extend(ctx, c.pool, fences, c.cfg.LeaseDuration)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Error("lease extension failed", "err", err, "leases", len(fences))
		}
		return
	}
	for _, h := range holders {
		if !kept[h.fence.ID] {
			h.cancel(ErrLeaseLost)
		}
	}
}

// completeReq asks the group committer to complete one effect.
type completeReq struct {
	fence store.Fence
	done  chan completeRes
}

type completeRes struct {
	lag time.Duration
	ok  bool
	err error
}

// groupCommit completes many fenced effects in one statement: it takes one
// request, then whatever else is already queued, up to CompletionBatch.
func (c *Client) groupCommit() {
	defer c.complWG.Done()
	batch := make([]completeReq, 0, c.cfg.CompletionBatch)
	fences := make([]store.Fence, 0, c.cfg.CompletionBatch)
	for req := range c.completions {
		batch = append(batch[:0], req)
	drain:
		for len(batch) < c.cfg.CompletionBatch {
			select {
			case r, ok := <-c.completions:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		fences = fences[:0]
		for _, r := range batch {
			fences = append(fences, r.fence)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		done, err := store.Complete(ctx, c.pool, fences)
		cancel()
		for _, r := range batch {
			lag, ok := done[r.fence.ID]
			r.done <- completeRes{lag: lag, ok: ok, err: err}
		}
	}
}
