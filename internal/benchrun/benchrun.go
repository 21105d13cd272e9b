// Package benchrun is the measurement code that `pgoutbox bench`
// (internal/cli) and the side-by-side benchmark (the bench/ module) share:
// the pgoutbox workers of a benchmark queue, and the drain, sustained and
// latency runs over any system's workers (a Runner).
//
// It is internal to the main module; the bench/ module may import it because
// Go decides "internal" by import path, and bench/'s module path
// (github.com/pgoutbox/pgoutbox/bench) lies under this module's root. The
// library's users cannot.
package benchrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// StopTimeout is how long a Runner is given to stop gracefully after a run.
const StopTimeout = 30 * time.Second

// Runner is one system's workers on a benchmark database.
type Runner interface {
	// InsertBatch writes n effects (sequence numbers seq..seq+n-1) in one
	// transaction on db (the producers' pool) with the system's bulk insert.
	InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error
	// InsertOne writes one effect in its own transaction on db and returns
	// its id once the transaction committed.
	InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error)
	// Start starts working; completions are counted in Completed.
	Start(ctx context.Context) error
	// Stop stops working, waiting for deliveries in flight until ctx ends.
	Stop(ctx context.Context) error
	// Completed counts the completed effects since Start.
	Completed() *Counter
}

// Counter counts completion events and signals when a target is reached.
// The zero value counts from 0.
type Counter struct {
	n      atomic.Int64
	mu     sync.Mutex
	target int64
	ch     chan struct{}
}

// Add adds d to the count.
func (c *Counter) Add(d int64) {
	v := c.n.Add(d)
	c.mu.Lock()
	if c.ch != nil && v >= c.target {
		close(c.ch)
		c.ch = nil
	}
	c.mu.Unlock()
}

// Load returns the count.
func (c *Counter) Load() int64 { return c.n.Load() }

// reach returns a channel closed once the count reaches target. One waiter
// at a time.
func (c *Counter) reach(target int64) <-chan struct{} {
	ch := make(chan struct{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n.Load() >= target {
		close(ch)
		return ch
	}
	c.target, c.ch = target, ch
	return ch
}

// Wait waits until the count reaches target (true), timeout passes or ctx
// ends (false). A timeout of 0 or less waits for ctx alone.
func (c *Counter) Wait(ctx context.Context, target int64, timeout time.Duration) bool {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-c.reach(target):
		return true
	case <-expired:
		return false
	case <-ctx.Done():
		return false
	}
}

// Progress shows a run's phase while it runs: frac reports the fraction done
// (0..1) and a note; the returned function ends the display. Nil shows
// nothing.
type Progress func(phase string, frac func() (float64, string)) (done func())

func (p Progress) start(phase string, frac func() (float64, string)) func() {
	if p == nil {
		return func() {}
	}
	return p(phase, frac)
}

// OpenPool opens a pool on dsn with at most conns connections (0: pgxpool's
// default), application_name pgoutbox-bench, and pings it.
func OpenPool(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if conns > 0 {
		cfg.MaxConns = int32(conns)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgoutbox-bench"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// WALLSN reads the current WAL position (server-wide).
func WALLSN(ctx context.Context, db *pgxpool.Pool) (string, error) {
	var lsn string
	err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}

// WALSince returns the WAL bytes written server-wide since lsn.
func WALSince(ctx context.Context, db *pgxpool.Pool, lsn string) (float64, error) {
	var d float64
	err := db.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8", lsn).Scan(&d)
	return d, err
}

// ProcessCPU is this process's user+system CPU time (0 when unknown).
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Percentile returns the q quantile (0..1) of sorted by nearest rank, NaN
// for no values.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// PgoutboxConfig configures the pgoutbox workers of a benchmark queue.
type PgoutboxConfig struct {
	// Queue is the queue the effects go to and the Clients work.
	Queue string
	// Type is the effect type; its handler does nothing but call OnStart.
	Type string
	// Payload is every effect's payload (marshalled by the library).
	Payload any
	// Concurrency is split between the Clients, the first ones taking the
	// remainder; each gets at least 1.
	Concurrency int
	// Clients is how many Clients work the queue (each has its own claim
	// loop); 0 or less means 1.
	Clients int
	// ClaimBatch is QueueConfig.ClaimBatch, capped at each Client's share
	// of Concurrency; 0 means that share.
	ClaimBatch int
	// RowLockLease is QueueConfig.RowLockLease (0: the engine default, 50 ms;
	// negative: durable leases).
	RowLockLease time.Duration
	// ClaimCooldown is QueueConfig.ClaimCooldown (0: none).
	ClaimCooldown time.Duration
	// Storage is QueueConfig.Storage ("": the engine default, which leaves
	// the queue's recorded storage as it is, rows in a fresh database;
	// pgoutbox.StorageBatch: the stream, delivered in batches). The Clients
	// record it when they start; call Pgoutbox.RecordStorage before
	// enqueuing a backlog that must go to it.
	Storage pgoutbox.Storage
	// PageSize is QueueConfig.PageSize, the effects one page of a batch
	// reads and settles (0: the engine default, pgoutbox.PageSizeDefault);
	// only a batch queue uses it.
	PageSize int
	// Lanes is QueueConfig.Lanes of a batch queue (0: the recorded count,
	// 1 in a fresh database).
	Lanes int
	// PollInterval is Config.PollInterval (0: the engine default).
	PollInterval time.Duration
	// CompletionBatch is Config.CompletionBatch (0: the engine default).
	CompletionBatch int
	// Key is the idempotency key of effect seq (nil:
	// pgoutbox.Key(Queue, seq)).
	Key func(seq int) string
	// OnStart, when set, is called at the start of every delivery with the
	// effect's id.
	OnStart func(id int64)
	// Work is how long each delivery's handler waits before it succeeds,
	// standing for the call to a target (0: it returns at once); with
	// PageHandler, each call's.
	Work time.Duration
	// PageHandler registers the type's handler as a PageHandler (false: a
	// Handler), which a batch queue calls once per page.
	PageHandler bool
	// Logger is the Clients' logger (nil: the library's default).
	Logger *slog.Logger
}

// Pgoutbox is the Runner of pgoutbox Clients. Pruning is off: a benchmark
// measures delivery, and its retention separately.
type Pgoutbox struct {
	cfg       PgoutboxConfig
	clients   []*pgoutbox.Client
	completed Counter
	unsubs    []func()
	cancel    context.CancelFunc
	done      sync.WaitGroup
}

// NewPgoutbox builds (but does not start) the Clients on pool.
func NewPgoutbox(pool *pgxpool.Pool, cfg PgoutboxConfig) (*Pgoutbox, error) {
	if cfg.Key == nil {
		cfg.Key = func(seq int) string { return pgoutbox.Key(cfg.Queue, strconv.Itoa(seq)) }
	}
	r := &Pgoutbox{cfg: cfg}
	onStart := cfg.OnStart
	// wait stands for the target's call: Work, unless ctx ends first.
	wait := func(ctx context.Context) error {
		if cfg.Work <= 0 {
			return nil
		}
		t := time.NewTimer(cfg.Work)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	typ := pgoutbox.EffectType{Name: cfg.Type, ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
		if onStart != nil {
			onStart(d.ID)
		}
		return wait(ctx)
	}}
	if cfg.PageHandler {
		typ.Handler = nil
		typ.PageHandler = func(ctx context.Context, ds []*pgoutbox.Delivery) []error {
			for _, d := range ds {
				if onStart != nil {
					onStart(d.ID)
				}
			}
			if err := wait(ctx); err != nil {
				return slices.Repeat([]error{err}, len(ds))
			}
			return nil
		}
	}
	clients := max(1, cfg.Clients)
	for i := range clients {
		conc := cfg.Concurrency / clients
		if i < cfg.Concurrency%clients {
			conc++
		}
		conc = max(conc, 1)
		batch := conc
		if cfg.ClaimBatch > 0 {
			batch = min(cfg.ClaimBatch, conc)
		}
		c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
			Queues: map[string]pgoutbox.QueueConfig{
				cfg.Queue: {Concurrency: conc, ClaimBatch: batch, RowLockLease: cfg.RowLockLease, ClaimCooldown: cfg.ClaimCooldown,
					Storage: cfg.Storage, PageSize: cfg.PageSize, Lanes: cfg.Lanes},
			},
			Types:           []pgoutbox.EffectType{typ},
			PollInterval:    cfg.PollInterval,
			CompletionBatch: cfg.CompletionBatch,
			PruneInterval:   -1,
			Logger:          cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
		r.clients = append(r.clients, c)
	}
	return r, nil
}

// RecordStorage records the queue's storage (PgoutboxConfig.Storage) in the
// database now, as the Clients do when they start, so that the effects
// enqueued before Start (a drain's backlog) go to that storage too: an
// enqueue into a queue whose storage is not recorded writes rows, and those
// a batch queue delivers from pgoutbox.effects, as exceptions. Without a
// Storage it does nothing.
func (r *Pgoutbox) RecordStorage(ctx context.Context, db *pgxpool.Pool) error {
	if r.cfg.Storage == "" {
		return nil
	}
	err := store.SetStorage(ctx, db, []string{r.cfg.Queue}, []string{string(r.cfg.Storage)}, []int32{int32(r.cfg.Lanes)})
	if err != nil {
		return fmt.Errorf("record the storage of queue %s: %w", r.cfg.Queue, err)
	}
	return nil
}

func (r *Pgoutbox) effect(seq int) pgoutbox.Effect {
	return pgoutbox.Effect{Queue: r.cfg.Queue, Type: r.cfg.Type, Key: r.cfg.Key(seq), Payload: r.cfg.Payload}
}

// InsertBatch enqueues effects seq..seq+n-1 in one transaction on db.
func (r *Pgoutbox) InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error {
	effects := make([]pgoutbox.Effect, n)
	for i := range effects {
		effects[i] = r.effect(seq + i)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
		return err
	})
}

// InsertOne enqueues effect seq in its own transaction on db.
func (r *Pgoutbox) InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(ctx, tx, r.effect(seq))
		HoldOpen(ctx)
		return err
	})
	return id, err
}

// Start subscribes to the Clients' completions and starts them; on an
// error the Clients already started are stopped.
func (r *Pgoutbox) Start(ctx context.Context) error {
	cctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for _, c := range r.clients {
		events, unsub := c.Subscribe(1 << 16)
		r.unsubs = append(r.unsubs, unsub)
		r.done.Go(func() {
			for {
				select {
				case e := <-events:
					if e.State == pgoutbox.StateCompleted {
						r.completed.Add(1)
					}
				case <-cctx.Done():
					return
				}
			}
		})
	}
	for _, c := range r.clients {
		if err := c.Start(ctx); err != nil {
			sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), StopTimeout)
			defer scancel()
			_ = r.Stop(sctx)
			return fmt.Errorf("pgoutbox start: %w", err)
		}
	}
	return nil
}

// Stop stops every Client and the completion counting.
func (r *Pgoutbox) Stop(ctx context.Context) error {
	var errs []error
	for _, c := range r.clients {
		errs = append(errs, c.Stop(ctx))
	}
	for _, u := range r.unsubs {
		u()
	}
	r.unsubs = nil
	if r.cancel != nil {
		r.cancel()
	}
	r.done.Wait()
	return errors.Join(errs...)
}

// Completed counts the Clients' completion events.
func (r *Pgoutbox) Completed() *Counter { return &r.completed }

// stop stops r with StopTimeout, even when ctx has ended.
func stop(ctx context.Context, r Runner) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), StopTimeout)
	defer cancel()
	_ = r.Stop(sctx)
}
