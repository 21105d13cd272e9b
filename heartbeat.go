package pgoutbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/engine"
)

// WorkerHeartbeat keeps a worker process's row in pgoutbox.workers, the
// live workers that `status`, the console and /workers read (migration
// 00026), as a started Client with queues does: written when Run starts and
// every Interval, deleted when Run's ctx ends. A process that delivers a
// queue's effects without a Client (a broker relay, say) runs one, so the
// queue does not read as served by no one.
type WorkerHeartbeat struct {
	// Pool is the database. Required.
	Pool *pgxpool.Pool
	// ID names the process: the lease_owner it claims as. Required.
	ID string
	// Interval is how often the row is upserted; 0 means
	// HeartbeatIntervalDefault (10 s). A row silent for 3 of its intervals
	// counts as dead.
	Interval time.Duration
	// Queues returns the queues the process works with their pool sizes
	// (parallel slices) and the deliveries in flight now. Required.
	Queues func() (queues []string, concurrency []int32, inFlight int)
	// Started is when the process started working; zero means when Run
	// starts.
	Started time.Time
	// Log receives an outage, once until the database answers again; nil
	// discards.
	Log *slog.Logger
}

// Run beats now and every Interval until ctx ends, then deletes the row. A
// beat in flight when ctx ends runs to its end first (for at most 15 s
// more).
func (h *WorkerHeartbeat) Run(ctx context.Context) {
	hb := engine.Heartbeat{DB: h.Pool, ID: h.ID, Interval: h.Interval, Log: h.Log, Queues: h.Queues, Started: h.Started}
	if hb.Interval <= 0 {
		hb.Interval = HeartbeatIntervalDefault
	}
	if hb.Log == nil {
		hb.Log = slog.New(slog.DiscardHandler)
	}
	if hb.Started.IsZero() {
		hb.Started = time.Now()
	}
	hb.Run(ctx)
}
