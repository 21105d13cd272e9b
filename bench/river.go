package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// riverSystem runs River (used as a library) with the settings of River's own
// benchmark: a no-op worker, FetchCooldown 2 ms, FetchPollInterval 20 ms,
// inserts with InsertManyFast.
type riverSystem struct {
	payloadBytes int
	logger       *slog.Logger
}

func (s *riverSystem) Name() string     { return "River" }
func (s *riverSystem) Tables() []string { return []string{"river_job"} }

func (s *riverSystem) Migrate(ctx context.Context, dsn string) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func (s *riverSystem) DiagnoseSQL() string {
	return `SELECT id, state::text, attempt, coalesce(attempted_at::text, '-'), coalesce(scheduled_at::text, '-'),
	        coalesce(errors::text, '-') FROM river_job WHERE state <> 'completed' ORDER BY id LIMIT 20`
}

func (s *riverSystem) ClaimLatencySQL() string {
	return `SELECT id, scheduled_at, attempted_at FROM river_job WHERE attempted_at IS NOT NULL`
}

// Retention deletes completed jobs in batches of 1,000, as River's job
// cleaner does once CompletedJobRetentionPeriod has passed (the cleaner
// itself only runs on the elected leader at its own interval).
func (s *riverSystem) Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	var total int64
	for {
		tag, err := pool.Exec(ctx, `DELETE FROM river_job WHERE id IN (
			SELECT id FROM river_job WHERE state = 'completed' ORDER BY id LIMIT 1000)`)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}

type noopWorker struct {
	river.WorkerDefaults[benchArgs]
	onWork func(id int64)
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[benchArgs]) error {
	if w.onWork != nil {
		w.onWork(job.ID)
	}
	return nil
}

func (s *riverSystem) Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error) {
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &noopWorker{onWork: wc.onWork}); err != nil {
		return nil, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Logger:            s.logger,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: wc.workers}},
		Workers:           workers,
	})
	if err != nil {
		return nil, err
	}
	return &riverRunner{client: client, pool: pool, args: newArgs(s.payloadBytes), completed: &benchrun.Counter{}}, nil
}

type riverRunner struct {
	client    *river.Client[pgx.Tx]
	pool      *pgxpool.Pool
	args      benchArgs
	completed *benchrun.Counter
	unsub     func()
	cancel    context.CancelFunc
	done      chan struct{}
}

// InsertBatch is InsertManyFast (COPY FROM) in a transaction of the
// producers' pool.
func (r *riverRunner) InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error {
	params := make([]river.InsertManyParams, n)
	for i := range params {
		params[i] = river.InsertManyParams{Args: r.args}
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := r.client.InsertManyFastTx(ctx, tx, params)
		return err
	})
}

func (r *riverRunner) InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		res, err := r.client.InsertTx(ctx, tx, r.args, nil)
		if err != nil {
			return err
		}
		id = res.Job.ID
		benchrun.HoldOpen(ctx)
		return nil
	})
	return id, err
}

func (r *riverRunner) Start(ctx context.Context) error {
	events, unsub := r.client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 1 << 16,
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
	})
	r.unsub = unsub
	r.done = make(chan struct{})
	cctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		for {
			select {
			case e, ok := <-events:
				if !ok {
					return
				}
				if e.Kind == river.EventKindJobCompleted {
					r.completed.Add(1)
				}
			case <-cctx.Done():
				return
			}
		}
	}()
	if err := r.client.Start(ctx); err != nil {
		return fmt.Errorf("river start: %w", err)
	}
	return nil
}

func (r *riverRunner) Stop(ctx context.Context) error {
	err := r.client.Stop(ctx)
	if r.unsub != nil {
		r.unsub()
		r.cancel()
		<-r.done
	}
	return err
}

func (r *riverRunner) Completed() *benchrun.Counter { return r.completed }
