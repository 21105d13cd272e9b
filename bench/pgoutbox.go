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
	// storage is QueueConfig.Storage (knob storage=rows|batch; "": the
	// engine default, rows in the benchmark's fresh databases).
	storage pgoutbox.Storage
	// pageSize is QueueConfig.PageSize of a batch queue (knob page=N; 0:
	// the engine default, pgoutbox.PageSizeDefault).
	pageSize int
	// lanes is QueueConfig.Lanes of a batch queue (knob lanes=N; 0: the
	// engine default, one lane in the benchmark's fresh databases).
	lanes int
	// work is how long each handler waits, standing for a target's
	// latency (knob work=D; 0: none).
	work time.Duration
	// pageHandler registers a PageHandler instead of a Handler (knob
	// handler=page; handler=one, the default: a Handler).
	pageHandler bool
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

func (s *pgSystem) Name() string { return s.name }

// batch reports whether s is batch storage (knob storage=batch).
func (s *pgSystem) batch() bool { return s.knobs.storage == pgoutbox.StorageBatch }

// streamTables are the stream's generations, the tables a batch queue's
// effects go to: pgoutbox.stream by its partitions, since the partitioned
// parent has no storage (its size is 0 and pgstattuple refuses it); its
// batches; and the row tables, where the exceptions go and the keys stay.
var streamTables = []string{"pgoutbox.stream_batches", "pgoutbox.stream_0", "pgoutbox.stream_1", "pgoutbox.stream_2",
	"pgoutbox.effects", "pgoutbox.effect_keys"}

// Tables: for batch storage the first table, whose update statistics are
// read, is pgoutbox.stream_batches, the only one its claims and settles
// update (the stream is append-only; a success writes no row).
func (s *pgSystem) Tables() []string {
	if s.batch() {
		return streamTables
	}
	return []string{"pgoutbox.effects", "pgoutbox.effect_keys"}
}

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

// DiagnoseSQL: for batch storage, the open batches first (id: the batch's
// first effect; state names the batch, its size and settled position;
// claimed: its lease owner; expires: its lease expiry), then the effects
// not completed in pgoutbox.effects (the exceptions).
func (s *pgSystem) DiagnoseSQL() string {
	if s.batch() {
		return `(SELECT min_id, 'batch ' || id || ' open: ' || effects || ' effects, ids ' || min_id || '..' || max_id ||
		        ', settled through ' || done_through, 0, coalesce(lease_owner, '-'), coalesce(lease_expires_at::text, '-'), '-'
		        FROM pgoutbox.stream_batches WHERE done_at IS NULL ORDER BY id LIMIT 10)
		UNION ALL
		(` + rowsDiagnoseSQL + `)`
	}
	return rowsDiagnoseSQL
}

// rowsDiagnoseSQL lists the effects of pgoutbox.effects not completed.
const rowsDiagnoseSQL = `SELECT id, state::text, attempts, coalesce(leased_at::text, '-'), coalesce(lease_expires_at::text, '-'),
	        coalesce(last_error, '-') FROM pgoutbox.effects WHERE state <> 'completed' ORDER BY id LIMIT 20`

func (s *pgSystem) ClaimLatencySQL() string {
	if s.batch() {
		// A stream row is never written after its insert and its batch
		// records no claim time per effect (the batch's lease is taken
		// once, its pages are read later, unrecorded): as for PgQ, the
		// claim latency figures are not measured; the latency scenario's
		// commit -> delivery start is.
		return ""
	}
	// A row-lock lease writes nothing at claim; the batch's closing UPDATE,
	// which runs in the claim transaction, records that transaction's start
	// (now()) as leased_at, so both lease modes report the claim's time.
	return `SELECT id, available_at, leased_at FROM pgoutbox.effects WHERE leased_at IS NOT NULL`
}

func (s *pgSystem) Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var streamed int64
	if s.batch() {
		// Batch storage: what the stream's rotation does once every batch
		// is settled and the generations are past their retention, at
		// once: every generation emptied by TRUNCATE, the batches
		// forgotten (the next tick, with no previous snapshot, takes every
		// row committed since). Then the keys of the truncated effects
		// are in neither table, and Prune's PruneKeys deletes them, so the
		// next cycle's enqueue with the same keys is not deduplicated away.
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pgoutbox.stream").Scan(&streamed); err != nil {
			return 0, err
		}
		if _, err := pool.Exec(ctx, "TRUNCATE pgoutbox.stream"); err != nil {
			return 0, err
		}
		if _, err := pool.Exec(ctx, "DELETE FROM pgoutbox.stream_batches"); err != nil {
			return 0, err
		}
	}
	// The engine's own pruning (Client.Prune) with a retention of 1 ns, in
	// its default batches, for the completed effects and for their
	// idempotency keys (which otherwise outlive them for KeyRetention, and
	// the next drain cycle reuses the same keys).
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{CompletedRetention: time.Nanosecond, KeyRetention: time.Nanosecond})
	if err != nil {
		return 0, err
	}
	n, err := c.Prune(ctx)
	return streamed + n, err
}

func (s *pgSystem) Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error) {
	cfg := benchrun.PgoutboxConfig{
		Queue: pgQueue, Type: pgType, Payload: newArgs(s.payloadBytes),
		Concurrency: wc.workers, Clients: s.knobs.clients, ClaimBatch: s.knobs.claimBatch,
		RowLockLease: s.knobs.rowLock, ClaimCooldown: s.knobs.claimCooldown,
		Storage: s.knobs.storage, PageSize: s.knobs.pageSize, Lanes: s.knobs.lanes, Work: s.knobs.work,
		PageHandler: s.knobs.pageHandler, PollInterval: s.knobs.poll, CompletionBatch: s.knobs.completionBatch,
		OnStart: wc.onWork, Logger: s.logger,
	}
	if s.knobs.seqKeys {
		cfg.Key = func(seq int) string { return fmt.Sprintf("bench-%012d", seq) }
	}
	r, err := benchrun.NewPgoutbox(pool, cfg)
	if err != nil {
		return nil, err
	}
	// The drain enqueues its backlog before the Clients start, which is
	// when they record the queue's storage: record it first, or the
	// backlog goes to pgoutbox.effects.
	if err := r.RecordStorage(ctx, pool); err != nil {
		return nil, err
	}
	return r, nil
}
