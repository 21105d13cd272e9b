package main

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
	// ClaimLatencySQL selects one interval per claimed row: claim time minus
	// the time the row became available (database clock).
	ClaimLatencySQL() string
	// DiagnoseSQL lists rows not completed: id, state, attempts, claimed
	// at, lease expiry or schedule, last error.
	DiagnoseSQL() string
	// Retention deletes every completed row in small batches, as the
	// system's retention would.
	Retention(ctx context.Context, pool *pgxpool.Pool) (int64, error)
}

// runner is one prepared client: it inserts, then runs until stopped.
type runner interface {
	// InsertBatch writes n effects (sequence numbers seq..seq+n-1) in one
	// transaction on db (the producers' pool) with the system's bulk insert.
	InsertBatch(ctx context.Context, db *pgxpool.Pool, seq, n int) error
	// InsertOne writes one effect in its own transaction on db and returns
	// its id once the transaction committed.
	InsertOne(ctx context.Context, db *pgxpool.Pool, seq int) (int64, error)
	// Start starts working; completions are counted in Completed.
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	Completed() *counter
}

// counter counts completion events and signals when a target is reached.
type counter struct {
	n      atomic.Int64
	mu     sync.Mutex
	target int64
	ch     chan struct{}
}

func (c *counter) add(d int64) {
	v := c.n.Add(d)
	c.mu.Lock()
	if c.ch != nil && v >= c.target {
		close(c.ch)
		c.ch = nil
	}
	c.mu.Unlock()
}

func (c *counter) Load() int64 { return c.n.Load() }

// reach returns a channel closed once the count reaches target.
func (c *counter) reach(target int64) <-chan struct{} {
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

// waitCount waits until c reaches target or timeout passes.
func waitCount(c *counter, target int64, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-c.reach(target):
		return true
	case <-t.C:
		return false
	}
}

// holdKey carries -latency-hold into InsertOne.
type holdKey struct{}

// holdOpen keeps a producer transaction open after its insert for the hold
// carried by ctx (-latency-hold), as an application that enqueues and then
// does other work before it commits.
func holdOpen(ctx context.Context) {
	if d, _ := ctx.Value(holdKey{}).(time.Duration); d > 0 {
		time.Sleep(d)
	}
}
