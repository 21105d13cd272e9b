package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
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
	cfg := benchrun.PgoutboxConfig{
		Queue: pgQueue, Type: pgType, Payload: newArgs(s.payloadBytes),
		Concurrency: wc.workers, Clients: s.knobs.clients, ClaimBatch: s.knobs.claimBatch,
		RowLockLease: s.knobs.rowLock, ClaimCooldown: s.knobs.claimCooldown,
		PollInterval: s.knobs.poll, CompletionBatch: s.knobs.completionBatch,
		OnStart: wc.onWork, Logger: s.logger,
	}
	if s.knobs.seqKeys {
		cfg.Key = func(seq int) string { return fmt.Sprintf("bench-%012d", seq) }
	}
	return benchrun.NewPgoutbox(pool, cfg)
}
