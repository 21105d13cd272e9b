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
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/engine"
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

	life   *engine.Lifecycle // start, stop with grace, stop twice
	leases engine.Leases     // in-flight durable leases, for the extender
	ext    engine.Extender   // extends leases
	commit *engine.Committer // group-commits completions; set by Start
	tracer trace.Tracer      // Config.TracerProvider's
	// claimMu lets one row-lock claim at a time wait for its second pool
	// connection (acquireClaimPair).
	claimMu sync.Mutex

	beat *engine.Heartbeat // its pgoutbox.workers row; set by Start when it has queues (liveness.go)
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
		life:   engine.NewLifecycle("pgoutbox: client"),
		tracer: cfg.TracerProvider.Tracer(TracerName),
	}
	c.ext = engine.Extender{DB: pool, Leases: &c.leases, Lease: cfg.LeaseDuration, LostCause: ErrLeaseLost, Log: c.log}
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
	return c.life.Start(func() error {
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
		var batches []*queueWorker
		if len(c.queues) > 0 {
			var err error
			if batches, err = c.recordStorage(ctx); err != nil {
				return err
			}
		}
		c.commit = engine.StartCommitter(c.pool, c.cfg.CompletionBatch, 2)
		for _, q := range c.queues {
			q.deliverer.Committer = c.commit
		}
		if len(c.queues) > 0 {
			c.life.Service(func(ctx context.Context) { c.ext.Run(ctx, c.cfg.LeaseDuration/3) })
		}
		c.life.OnStop(c.commit.Close)
		c.startLiveness()
		if listenCfg != nil {
			l := &engine.Listener{
				Config: listenCfg, RetryMax: listenRetryMax, Log: c.log,
				Wake: func(queue string) {
					if q, ok := c.queues[queue]; ok {
						signal(q.wake)
						signal(q.batchWake)
					}
				},
				WakeAll: func() {
					for _, q := range c.queues {
						signal(q.wake)
						signal(q.batchWake)
					}
				},
			}
			c.life.Go(l.Run)
		}
		for _, q := range c.queues {
			c.life.Go(q.run)
		}
		c.startBatches(batches)
		c.life.Go(c.maintain)
		c.log.Info("pgoutbox client started", "id", c.cfg.ID, "queues", len(c.queues))
		return nil
	})
}

// Stop stops claiming, lets in-flight deliveries finish until ctx ends, then
// cancels the rest; an interrupted replay-safe effect is released to
// available, an interrupted non-replay-safe one whose delivery started goes
// to reconciliation_required. Stop returns when every goroutine has exited.
// A statement of the client's own loops in flight when Stop begins (a
// claim, a sweep, park or prune statement, a heartbeat, a sample, a lease
// extension) runs to its end, for at most 15 s more, and none starts
// after: one cut short went on running on the server after Stop returned,
// as pgx closes its connection in the background. Handlers must honour
// their context.
func (c *Client) Stop(ctx context.Context) error {
	ran, err := c.life.Stop(ctx, errShutdown)
	if err != nil {
		err = fmt.Errorf("pgoutbox: stop deadline passed, in-flight deliveries were interrupted: %w", err)
	}
	if ran {
		c.log.Info("pgoutbox client stopped", "id", c.cfg.ID)
	}
	return err
}

// finishCtx is the context of a delivery's final write: it survives the
// delivery's own cancellation but is still bounded.
func finishCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return engine.FinishCtx(ctx)
}

// Sweep recovers expired leases once (the maintenance loop does this every
// SweepInterval) and returns how many it moved; then it un-parks the parked
// effects nothing blocks any more and parks the waiting followers of
// blocked ordering keys (docs/ordering.md, "Parking").
func (c *Client) Sweep(ctx context.Context) (int, error) { return c.sweep(pass{ctx: ctx}) }

// sweep is Sweep, each statement run by p.
func (c *Client) sweep(p pass) (int, error) {
	total := 0
	for {
		rescued, err := stmt(p, func(ctx context.Context) ([]store.Rescued, error) {
			return store.Sweep(ctx, c.pool, c.cfg.SweepBatch, 0)
		})
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
			break
		}
	}
	return total, c.park(p)
}

// park is the sweeper's parking pass (docs/ordering.md, "Parking"): it
// un-parks, in batches of SweepBatch, the parked effects no predecessor
// blocks any more (the safety net behind the un-park trigger), then parks
// the waiting followers of blocked ordering keys that wait behind at least
// store.ParkBehindDefault (32) others, so the claim scan skips them.
func (c *Client) park(p pass) error {
	for {
		queues, err := stmt(p, func(ctx context.Context) ([]string, error) {
			return store.Unpark(ctx, c.pool, c.cfg.SweepBatch)
		})
		if err != nil {
			return fmt.Errorf("pgoutbox: unpark: %w", err)
		}
		for _, name := range queues {
			if q := c.queues[name]; q != nil {
				signal(q.wake)
			}
		}
		if len(queues) < c.cfg.SweepBatch {
			break
		}
	}
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.Park(ctx, c.pool, "", store.ParkBehindDefault, c.cfg.SweepBatch)
		})
		if err != nil {
			return fmt.Errorf("pgoutbox: park: %w", err)
		}
		if n == 0 {
			return nil
		}
	}
}

// Prune deletes completed effects older than CompletedRetention in batches of
// PruneBatch and returns how many it deleted; then it deletes, in batches of
// PruneBatch too, the idempotency keys older than KeyRetention whose effect
// is gone, the NOTIFY limiter's notify_pending rows of backends that are
// no longer live, the stream generations of batch storage that are settled
// and were closed at least CompletedRetention ago (by TRUNCATE; the current
// one is closed once it is as old), batch storage's completion counts
// older than CompletedRetention, and the records of row-lock batches
// that died holding effects which have all moved on since (none counted in
// the result).
func (c *Client) Prune(ctx context.Context) (int64, error) { return c.prune(pass{ctx: ctx}) }

// prune is Prune, each statement run by p.
func (c *Client) prune(p pass) (int64, error) {
	var total int64
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.Prune(ctx, c.pool, c.cfg.CompletedRetention, c.cfg.PruneBatch)
		})
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune: %w", err)
		}
		total += n
		if n < int64(c.cfg.PruneBatch) {
			break
		}
	}
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.PruneKeys(ctx, c.pool, c.cfg.KeyRetention, c.cfg.PruneBatch)
		})
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune keys: %w", err)
		}
		if n < int64(c.cfg.PruneBatch) {
			break
		}
	}
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.PruneNotifyPending(ctx, c.pool, c.cfg.PruneBatch)
		})
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune notify_pending: %w", err)
		}
		if n < int64(c.cfg.PruneBatch) {
			break
		}
	}
	// The stream's generations (batch storage): emptied by TRUNCATE once
	// settled and closed for CompletedRetention, rotated after as long. A
	// queue switched back to rows whose stream holds nothing unsettled:
	// its claims stop reading the stream's floor.
	if err := p.do(func(ctx context.Context) error {
		if _, err := store.StreamMaintain(ctx, c.pool, c.cfg.CompletedRetention, c.cfg.CompletedRetention); err != nil {
			return err
		}
		_, err := store.ClearLeftBatch(ctx, c.pool)
		return err
	}); err != nil {
		return total, fmt.Errorf("pgoutbox: maintain the stream: %w", err)
	}
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.PruneSettled(ctx, c.pool, c.cfg.CompletedRetention, c.cfg.PruneBatch)
		})
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune stream_settled: %w", err)
		}
		if n < int64(c.cfg.PruneBatch) {
			break
		}
	}
	for {
		n, err := stmt(p, func(ctx context.Context) (int64, error) {
			return store.PruneLockClaims(ctx, c.pool, c.cfg.PruneBatch)
		})
		if err != nil {
			return total, fmt.Errorf("pgoutbox: prune lock_claims: %w", err)
		}
		if n < int64(c.cfg.PruneBatch) {
			return total, nil
		}
	}
}

// maintain runs the sweeper and the pruning until ctx, the run context,
// ends. Stop ends it between statements, never in one (finishing pass).
func (c *Client) maintain(ctx context.Context) {
	p := pass{ctx: ctx, finish: true}
	tick := func(d time.Duration) <-chan time.Time {
		if d < 0 {
			return nil
		}
		return time.NewTicker(d).C
	}
	sweep, prune := tick(c.cfg.SweepInterval), tick(c.cfg.PruneInterval)
	// While the database is down each task logs once, at the outage's
	// start, and once when it works again (engine.Outage).
	sweeps := engine.Outage{Log: c.log, What: "sweep"}
	prunes := engine.Outage{Log: c.log, What: "prune"}
	if sweep != nil {
		// A backlog of blocked followers enqueued while no client ran is
		// parked now, not one sweep interval later.
		if err := c.park(p); ctx.Err() == nil {
			sweeps.Report(err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-sweep:
			_, err := c.sweep(p)
			if err == nil && len(c.queues) > 0 {
				err = c.refreshStorage(p)
			}
			if ctx.Err() == nil {
				sweeps.Report(err)
			}
		case <-prune:
			if _, err := c.prune(p); ctx.Err() == nil {
				prunes.Report(err)
			}
		}
	}
}

// pass runs the statements of a maintenance pass (sweep, park, prune), each
// only while ctx lasts. Under a finishing pass (the maintenance loop's) a
// statement that has begun runs to its end when ctx ends meanwhile, bounded
// (engine.Outlive), and the pass stops before the next one: a statement
// cut short went on running on the server after Stop returned, since pgx
// closes its connection in the background (a cancel request, then
// Terminate), and showed as a transaction open after Stop.
type pass struct {
	ctx    context.Context
	finish bool
}

// do runs one statement of the pass.
func (p pass) do(statement func(ctx context.Context) error) error {
	_, err := stmt(p, func(ctx context.Context) (struct{}, error) { return struct{}{}, statement(ctx) })
	return err
}

// stmt runs one statement of pass p and returns its result.
func stmt[T any](p pass, statement func(ctx context.Context) (T, error)) (T, error) {
	if err := p.ctx.Err(); err != nil {
		var zero T
		return zero, err
	}
	if !p.finish {
		return statement(p.ctx)
	}
	ctx, cancel := engine.Outlive(p.ctx)
	defer cancel()
	return statement(ctx)
}

// extendLeases extends the leases of every in-flight delivery now (the
// extender does this every LeaseDuration/3) and cancels, with cause
// ErrLeaseLost, the deliveries whose lease was lost.
func (c *Client) extendLeases(ctx context.Context) { c.ext.ExtendNow(ctx) }
