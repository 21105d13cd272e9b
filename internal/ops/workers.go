package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// WorkerStaleBeats is how many of its own heartbeat intervals a worker may
// miss before it counts as dead (docs/operations.md "Live workers"): 3, so
// with the default 10 s heartbeat a process killed without a clean stop
// leaves the live list 30 s after its last heartbeat.
const WorkerStaleBeats = store.WorkerStaleBeats

// Worker is one live worker process: a Client with queues whose last
// heartbeat is within WorkerStaleBeats of its interval.
type Worker struct {
	// ID is the Client's ID, as in lease_owner and the samples.
	ID      string `json:"id"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Version string `json:"version,omitempty"`
	// Queues are the queues the process works, by name, each with its
	// worker pool's size.
	Queues []WorkerQueue `json:"queues"`
	// InFlight counts the deliveries running at the last heartbeat.
	InFlight int `json:"in_flight"`
	// HeartbeatIntervalSeconds is the process's heartbeat interval.
	HeartbeatIntervalSeconds float64 `json:"heartbeat_interval_seconds"`
	// StartedAt is when the process's Client started (its clock).
	StartedAt time.Time `json:"started_at"`
	// HeartbeatAgeSeconds and UptimeSeconds use the database clock.
	HeartbeatAgeSeconds float64 `json:"heartbeat_age_seconds"`
	UptimeSeconds       float64 `json:"uptime_seconds"`
}

// WorkerQueue is one queue of a live worker.
type WorkerQueue struct {
	Queue       string `json:"queue"`
	Concurrency int    `json:"concurrency"`
}

// LiveWorkers returns the live worker processes, by host, pid and id.
// Dead ones (no heartbeat for WorkerStaleBeats intervals) are left out.
func LiveWorkers(ctx context.Context, db store.DBTX) ([]Worker, error) {
	rows, err := store.LiveWorkers(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("ops: live workers: %w", err)
	}
	out := make([]Worker, 0, len(rows))
	for _, r := range rows {
		w := Worker{
			ID: r.ID, Host: r.Host, PID: r.PID, Version: r.Version, InFlight: r.InFlight,
			HeartbeatIntervalSeconds: r.Interval.Seconds(), StartedAt: r.StartedAt,
			HeartbeatAgeSeconds: r.HeartbeatAge.Seconds(), UptimeSeconds: r.Uptime.Seconds(),
			Queues: make([]WorkerQueue, len(r.Queues)),
		}
		for i, q := range r.Queues {
			w.Queues[i] = WorkerQueue{Queue: q, Concurrency: int(r.Concurrency[i])}
		}
		out = append(out, w)
	}
	return out, nil
}

// UnservedQueue is a queue holding available or leased effects that no
// live worker works: nothing will deliver them until a worker for the
// queue starts (leased ones go back to available when their lease
// expires, if some process sweeps).
type UnservedQueue struct {
	Queue     string `json:"queue"`
	Available int64  `json:"available"`
	Leased    int64  `json:"leased"`
	// OldestAvailableAgeSeconds is now() minus the oldest available_at of a
	// due available effect (database clock); 0 when none is due.
	OldestAvailableAgeSeconds float64 `json:"oldest_available_age_seconds"`
}

// UnservedQueues returns, by name, the queues holding available or leased
// effects that no live worker works. One aggregate over the available and
// leased effects.
func UnservedQueues(ctx context.Context, db store.DBTX) ([]UnservedQueue, error) {
	rows, err := store.UnservedQueues(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("ops: unserved queues: %w", err)
	}
	out := make([]UnservedQueue, len(rows))
	for i, r := range rows {
		out[i] = UnservedQueue{Queue: r.Queue, Available: r.Available, Leased: r.Leased,
			OldestAvailableAgeSeconds: r.OldestAvailableAge.Seconds()}
	}
	return out, nil
}
