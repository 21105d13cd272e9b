package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
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
	rowLock         time.Duration // QueueConfig.RowLockLease; 0: the engine default (50 ms); negative: durable leases
	claimCooldown   time.Duration // QueueConfig.ClaimCooldown; 0: none
	// seqKeys makes idempotency keys ascending ("bench-000000000042")
	// instead of pgoutbox.Key's random SHA-256 hex: a diagnostic of what the
	// unique key index costs when keys arrive in random order.
	seqKeys bool
	// notify00005 puts back migration 00005's NOTIFY limiter (an open
	// transaction holding the queue's notifier lock silences the other
	// producers) after the migrations: the before of migration 00011.
	notify00005 bool
}

// notify00005SQL is migration 00005's limiter, as 00011's Down restores it.
const notify00005SQL = `
DROP TABLE pgoutbox.notify_state;
CREATE UNLOGGED TABLE pgoutbox.notify_state (queue text PRIMARY KEY, notified_at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION pgoutbox.notify_effects() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN SELECT DISTINCT n.queue FROM new_effects n WHERE n.state = 'available' LOOP
        IF pg_try_advisory_xact_lock(hashtextextended('pgoutbox.notify.' || q, 0)) THEN
            INSERT INTO pgoutbox.notify_state AS s (queue, notified_at) VALUES (q, clock_timestamp())
            ON CONFLICT (queue) DO UPDATE SET notified_at = excluded.notified_at
                WHERE s.notified_at < clock_timestamp() - interval '10 milliseconds';
            IF FOUND THEN
                PERFORM pg_notify('pgoutbox_effects', q);
            END IF;
        END IF;
    END LOOP;
    RETURN NULL;
END;
$$;`

type pgSystem struct {
	name         string // "pgoutbox", or a variant such as "pgoutbox[clients=2]"
	knobs        pgKnobs
	payloadBytes int
	logger       *slog.Logger
}

func (s *pgSystem) Name() string     { return s.name }
func (s *pgSystem) Tables() []string { return []string{"pgoutbox.effects", "pgoutbox.effect_keys"} }

func (s *pgSystem) Migrate(ctx context.Context, dsn string) error {
	if _, err := migrations.Up(ctx, dsn); err != nil || !s.knobs.notify00005 {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, notify00005SQL)
	return err
}

func (s *pgSystem) DiagnoseSQL() string {
	return `SELECT id, state::text, attempts, coalesce(leased_at::text, '-'), coalesce(lease_expires_at::text, '-'),
	        coalesce(last_error, '-') FROM pgoutbox.effects WHERE state <> 'completed' ORDER BY id LIMIT 20`
}

func (s *pgSystem) ClaimLatencySQL() string {
	// A row-lock lease writes nothing at claim; the batch's closing UPDATE,
	// which runs in the claim transaction, records that transaction's start
	// (now()) as leased_at, so both lease modes report the claim's time.
	return `SELECT id, available_at, leased_at FROM pgoutbox.effects WHERE leased_at IS NOT NULL`
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
