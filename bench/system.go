package main

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// benchArgs is the payload of every effect and job: a JSON object of exactly
// payloadBytes bytes ({"pad":"xxx…"}), marshalled with encoding/json by both
// systems.
type benchArgs struct {
	Pad string `json:"pad"`
}

// Kind is River's job kind.
func (benchArgs) Kind() string { return "bench" }

func newArgs(payloadBytes int) benchArgs {
	n := max(payloadBytes-len(`{"pad":""}`), 0)
	return benchArgs{Pad: strings.Repeat("x", n)}
}

// workerConfig sizes one system's worker pool for a scenario.
type workerConfig struct {
	workers int // River MaxWorkers, pgoutbox Concurrency
	// onWork, when set, is called at the start of every delivery with the
	// effect/job id.
	onWork func(id int64)
}

// system is one side of the comparison. Everything it writes lives in the
// database behind pool, which is fresh for each scenario.
type system interface {
	Name() string
	// Migrate installs the system's schema into the database at dsn.
	Migrate(ctx context.Context, dsn string) error
	// Tables are the relations the system writes; the first is the queue
	// table (whose statistics are read), and the size reported is the sum
	// of all of them with their indexes.
	Tables() []string
	// Prepare builds (but does not start) a worker client on pool.
	Prepare(ctx context.Context, pool *pgxpool.Pool, wc workerConfig) (runner, error)
	// ClaimLatencySQL selects, for every claimed row, its id, when it became
	// available and when it was claimed (timestamptz, database clock).
	ClaimLatencySQL() string
	// DiagnoseSQL lists rows not completed: id, state, attempts, claimed
	// at, lease expiry or schedule, last error.
	DiagnoseSQL() string
	// Retention deletes every completed row in small batches, as the
	// system's retention would.
	Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error)
}

// runner is one prepared client: it inserts, then runs until stopped; one system's workers (benchrun.Runner).
type runner = benchrun.Runner

// loops is the plumbing of a runner whose work is its own goroutines (the
// SQL ceilings, PgQ's ticker and consumer): Stop cancels and waits for
// them, and returns the first error one of them recorded with fail.
type loops struct {
	completed *benchrun.Counter
	cancel    context.CancelFunc
	done      sync.WaitGroup
	mu        sync.Mutex
	err       error
}

// fail records err unless it is nil or the loops are stopping (ctx ended).
func (l *loops) fail(ctx context.Context, err error) {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	l.mu.Lock()
	if l.err == nil {
		l.err = err
	}
	l.mu.Unlock()
}

func (l *loops) Stop(ctx context.Context) error {
	if l.cancel != nil {
		l.cancel()
	}
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *loops) Completed() *benchrun.Counter { return l.completed }
