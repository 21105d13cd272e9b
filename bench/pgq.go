package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// pgqSystem is PgQ (the pgq extension, Debian's postgresql-NN-pgq3), driven
// through its own batch API:
//
//   - producers call pgq.insert_event(queue, type, data), one statement per
//     producer batch (SELECT pgq.insert_event(…) FROM unnest(payloads));
//   - a ticker loop calls SELECT pgq.ticker() every -pgq-ticker (what the
//     pgqd daemon does every ticker_period, 1 s by default); a call makes a
//     tick when the queue's own limits say so: 500 new events
//     (queue_ticker_max_count) or 3 s since the last tick
//     (queue_ticker_max_lag), both left at their defaults;
//   - one consumer loop calls pgq.next_batch, reads the batch with
//     pgq.get_batch_events and closes it with pgq.finish_batch, each in its
//     own transaction; an empty next_batch backs off from 0.5 ms to 8 ms.
//
// A PgQ consumer works its batches one after the other: a second registered
// consumer would receive every event again, so the workers' count does not
// apply and the scale scenario (several processes on one queue) is not run.
// Nothing is written per event after its insert: the consumer's position
// moves once per batch, and the event tables are rotated and TRUNCATEd
// (pgq.maint_rotate_tables_step1/2, by pgqd every maint_period, 2 h of
// queue_rotation_period by default), which a benchmark run is too short to
// see; Retention truncates them directly.
type pgqSystem struct {
	payloadBytes int
	tickEvery    time.Duration
}

const (
	pgqQueue    = "bench"
	pgqConsumer = "bench"
	// pgqTable is the queue's event table prefix in a fresh database: the
	// first queue gets id 1 (pgq.queue's sequence), hence pgq.event_1 and
	// its three rotated children, events going to _0 first.
	pgqTable = "pgq.event_1"
)

func (s *pgqSystem) Name() string { return "PgQ" }

func (s *pgqSystem) Tables() []string {
	return []string{pgqTable + "_0", pgqTable + "_1", pgqTable + "_2", pgqTable}
}

// supports: several processes on one PgQ consumer would process the same
// batches (see pgqSystem).
func (s *pgqSystem) supports(scenario string) bool { return scenario != "scale" }

// available reports why PgQ cannot run on the server behind pool (the
// extension is not installed), nil when it can.
func (s *pgqSystem) available(ctx context.Context, pool *pgxpool.Pool) error {
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pgq')`).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("the pgq extension is not installed on the server (Debian: apt-get install postgresql-NN-pgq3 for the server's major version NN; make bench does it through scripts/test-deps bench)")
	}
	return nil
}

func (s *pgqSystem) Migrate(ctx context.Context, dsn string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgq"); err != nil {
		return fmt.Errorf("create extension pgq: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pgq.create_queue($1)", pgqQueue); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pgq.register_consumer($1, $2)", pgqQueue, pgqConsumer); err != nil {
		return err
	}
	var pfx string
	if err := conn.QueryRow(ctx, "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = $1", pgqQueue).Scan(&pfx); err != nil {
		return err
	}
	if pfx != pgqTable {
		return fmt.Errorf("pgq: queue tables are %s, expected %s in a fresh database", pfx, pgqTable)
	}
	return nil
}

func (s *pgqSystem) DiagnoseSQL() string {
	return `SELECT ev_id, 'not consumed at tick ' || coalesce((SELECT sub_last_tick::text FROM pgq.subscription LIMIT 1), '-'),
	        coalesce(ev_retry, 0), ev_time::text, '-', '-'
	        FROM ` + pgqTable + ` ORDER BY ev_id DESC LIMIT 20`
}

// ClaimLatencySQL: PgQ records no claim time per event (a batch's events
// are read, never updated), so the claim latency figures are not measured;
// the latency scenario's commit -> delivery start is.
func (s *pgqSystem) ClaimLatencySQL() string { return "" }

// Retention truncates the event tables: what pgq's rotation does to each
// of them once every consumer has passed it, which after a drain they all
// have.
func (s *pgqSystem) Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var n int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+pgqTable).Scan(&n); err != nil {
		return 0, err
	}
	_, err := pool.Exec(ctx, "TRUNCATE "+pgqTable+"_0, "+pgqTable+"_1, "+pgqTable+"_2")
	return n, err
}

func (s *pgqSystem) Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error) {
	payload, err := json.Marshal(newArgs(s.payloadBytes))
	if err != nil {
		return nil, err
	}
	return &pgqRunner{sys: s, pool: pool, payload: string(payload), onWork: wc.onWork, loops: loops{completed: &benchrun.Counter{}}}, nil
}

type pgqRunner struct {
	sys     *pgqSystem
	pool    *pgxpool.Pool
	payload string
	onWork  func(id int64)
	loops
}

// pgqInsert inserts one event per payload with pgq.insert_event, in one
// statement.
const pgqInsert = `SELECT count(pgq.insert_event($1, $2, p)) FROM unnest($3::text[]) AS t(p)`

func (r *pgqRunner) InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error {
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = r.payload
	}
	_, err := db.Exec(ctx, pgqInsert, pgqQueue, pgType, payloads)
	return err
}

func (r *pgqRunner) InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT pgq.insert_event($1, $2, $3)", pgqQueue, pgType, r.payload).Scan(&id); err != nil {
			return err
		}
		benchrun.HoldOpen(ctx)
		return nil
	})
	return id, err
}

func (r *pgqRunner) Start(ctx context.Context) error {
	cctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	// A first tick at once: the backlog of a drain becomes a batch without
	// waiting for the ticker's first period.
	if _, err := r.pool.Exec(ctx, "SELECT pgq.ticker()"); err != nil {
		cancel()
		return fmt.Errorf("pgq ticker: %w", err)
	}
	r.done.Go(func() { r.ticker(cctx) })
	r.done.Go(func() { r.consume(cctx) })
	return nil
}

// ticker is pgqd's ticker: SELECT pgq.ticker() every tickEvery.
func (r *pgqRunner) ticker(ctx context.Context) {
	t := time.NewTicker(r.sys.tickEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := r.pool.Exec(ctx, "SELECT pgq.ticker()"); err != nil {
			r.fail(ctx, fmt.Errorf("pgq ticker: %w", err))
		}
	}
}

// consume is the consumer loop: next_batch, get_batch_events, finish_batch.
func (r *pgqRunner) consume(ctx context.Context) {
	idle := time.Duration(0)
	for ctx.Err() == nil {
		n, err := r.batch(ctx)
		switch {
		case err != nil:
			r.fail(ctx, err)
			idle = 10 * time.Millisecond
		case n != 0:
			idle = 0
			continue
		default:
			idle = min(max(idle*2, 500*time.Microsecond), 8*time.Millisecond)
		}
		select {
		case <-ctx.Done():
		case <-time.After(idle):
		}
	}
}

// batch processes the next batch: the number of its events, or -1 for an
// empty batch (a tick with no events; the next may follow at once), or 0
// when there is no batch yet.
func (r *pgqRunner) batch(ctx context.Context) (int, error) {
	var id *int64
	if err := r.pool.QueryRow(ctx, "SELECT pgq.next_batch($1, $2)", pgqQueue, pgqConsumer).Scan(&id); err != nil {
		return 0, fmt.Errorf("pgq next_batch: %w", err)
	}
	if id == nil {
		return 0, nil
	}
	rows, err := r.pool.Query(ctx, "SELECT ev_id, ev_data FROM pgq.get_batch_events($1)", *id)
	if err != nil {
		return 0, fmt.Errorf("pgq get_batch_events: %w", err)
	}
	ids, err := scanIDs(rows)
	if err != nil {
		return 0, fmt.Errorf("pgq get_batch_events: %w", err)
	}
	if r.onWork != nil {
		for _, ev := range ids {
			r.onWork(ev)
		}
	}
	if _, err := r.pool.Exec(ctx, "SELECT pgq.finish_batch($1)", *id); err != nil {
		return 0, fmt.Errorf("pgq finish_batch: %w", err)
	}
	r.completed.Add(int64(len(ids)))
	if len(ids) == 0 {
		return -1, nil
	}
	return len(ids), nil
}
