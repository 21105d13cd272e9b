package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrations"
)

const (
	pgQueue = "bench"
	pgType  = "noop"
)

// pgKnobs are pgoutbox's tuning knobs (flags -pg-*).
type pgKnobs struct {
	claimBatch      int // 0: the engine default (Concurrency)
	completionBatch int // 0: the engine default
	poll            time.Duration
	clients         int           // Clients per process on the same queue, splitting the workers
	rowLock         time.Duration // QueueConfig.RowLockLease; 0: durable leases
	claimCooldown   time.Duration // QueueConfig.ClaimCooldown; 0: none
	// seqKeys makes idempotency keys ascending ("bench-000000000042")
	// instead of pgoutbox.Key's random SHA-256 hex: a diagnostic of what the
	// unique key index costs when keys arrive in random order.
	seqKeys bool
}

type pgSystem struct {
	name         string // "pgoutbox", or a variant such as "pgoutbox[clients=2]"
	knobs        pgKnobs
	payloadBytes int
	logger       *slog.Logger
}

func (s *pgSystem) Name() string     { return s.name }
func (s *pgSystem) Tables() []string { return []string{"pgoutbox.effects", "pgoutbox.effect_keys"} }

func (s *pgSystem) Migrate(ctx context.Context, dsn string) error {
	_, err := migrations.Up(ctx, dsn)
	return err
}

func (s *pgSystem) DiagnoseSQL() string {
	return `SELECT id, state::text, attempts, coalesce(leased_at::text, '-'), coalesce(lease_expires_at::text, '-'),
	        coalesce(last_error, '-') FROM pgoutbox.effects WHERE state <> 'completed' ORDER BY id LIMIT 20`
}

func (s *pgSystem) ClaimLatencySQL() string {
	// A row-lock lease writes no leased_at: its claim latency is bounded
	// above by completed_at (claim + delivery + the batch's close).
	return `SELECT coalesce(leased_at, completed_at) - available_at FROM pgoutbox.effects
	        WHERE coalesce(leased_at, completed_at) IS NOT NULL`
}

func (s *pgSystem) Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	// The engine's own pruning (Client.Prune) with a retention of 1 ns, in
	// its default batches, for the completed effects and for their
	// idempotency keys (which otherwise outlive them for KeyRetention, and
	// the next drain cycle reuses the same keys).
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{CompletedRetention: time.Nanosecond, KeyRetention: time.Nanosecond})
	if err != nil {
		return 0, err
	}
	return c.Prune(ctx)
}

func (s *pgSystem) Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error) {
	r := &pgRunner{pool: pool, args: newArgs(s.payloadBytes), seqKeys: s.knobs.seqKeys, completed: &counter{}}
	onWork := wc.onWork
	handler := func(ctx context.Context, d *pgoutbox.Delivery) error {
		if onWork != nil {
			onWork(d.ID)
		}
		return nil
	}
	clients := max(1, s.knobs.clients)
	for i := range clients {
		// Split the workers: the first clients take the remainder.
		workers := wc.workers / clients
		if i < wc.workers%clients {
			workers++
		}
		batch := min(s.knobs.claimBatch, workers)
		c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
			Queues: map[string]pgoutbox.QueueConfig{
				pgQueue: {Concurrency: workers, ClaimBatch: batch, RowLockLease: s.knobs.rowLock, ClaimCooldown: s.knobs.claimCooldown},
			},
			Types:           []pgoutbox.EffectType{{Name: pgType, ReplaySafe: true, Handler: handler}},
			PollInterval:    s.knobs.poll,
			CompletionBatch: s.knobs.completionBatch,
			// The benchmark measures delivery; retention is measured
			// separately (Retention).
			PruneInterval: -1,
			Logger:        s.logger,
		})
		if err != nil {
			return nil, err
		}
		r.clients = append(r.clients, c)
	}
	return r, nil
}

type pgRunner struct {
	pool      *pgxpool.Pool
	clients   []*pgoutbox.Client
	args      benchArgs
	seqKeys   bool // pgKnobs.seqKeys
	completed *counter
	unsubs    []func()
	cancel    context.CancelFunc
	done      sync.WaitGroup
}

func (r *pgRunner) effect(seq int) pgoutbox.Effect {
	key := pgoutbox.Key("bench", strconv.Itoa(seq))
	if r.seqKeys {
		key = fmt.Sprintf("bench-%012d", seq)
	}
	return pgoutbox.Effect{Queue: pgQueue, Type: pgType, Key: key, Payload: r.args}
}

func (r *pgRunner) InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error {
	effects := make([]pgoutbox.Effect, n)
	for i := range effects {
		effects[i] = r.effect(seq + i)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
		return err
	})
}

func (r *pgRunner) InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(ctx, tx, r.effect(seq))
		return err
	})
	return id, err
}

func (r *pgRunner) Start(ctx context.Context) error {
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
						r.completed.add(1)
					}
				case <-cctx.Done():
					return
				}
			}
		})
	}
	for _, c := range r.clients {
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("pgoutbox start: %w", err)
		}
	}
	return nil
}

func (r *pgRunner) Stop(ctx context.Context) error {
	var errs []error
	for _, c := range r.clients {
		errs = append(errs, c.Stop(ctx))
	}
	for _, u := range r.unsubs {
		u()
	}
	if r.cancel != nil {
		r.cancel()
	}
	r.done.Wait()
	return errors.Join(errs...)
}

func (r *pgRunner) Completed() *counter { return r.completed }
