package store

import (
	"context"
	"time"
)

// WorkerStaleBeats is how many of its own heartbeat intervals a worker's
// row may go without a heartbeat before it counts as dead: readers skip it
// and the next heartbeat of any worker deletes it (migration 00026).
const WorkerStaleBeats = 3

// WorkerBeat is what a worker process writes at each heartbeat.
type WorkerBeat struct {
	// ID is the Client's ID (lease_owner, the samples' worker).
	ID      string
	Host    string
	PID     int
	Version string
	// Queues and Concurrency are parallel: each queue the process works
	// and its worker pool's size.
	Queues      []string
	Concurrency []int32
	// InFlight counts the deliveries running when the beat is written.
	InFlight int
	// Interval is the process's heartbeat interval.
	Interval  time.Duration
	StartedAt time.Time
}

// heartbeatSQL upserts the worker's row and, in the same statement, deletes
// the rows of dead workers (no heartbeat for WorkerStaleBeats of their
// intervals). The table holds one row per live process: both parts are
// tiny.
const heartbeatSQL = `
WITH dead AS (
    DELETE FROM pgoutbox.workers
    WHERE id <> $1 AND heartbeat_at < now() - make_interval(secs => heartbeat_interval_s * $10)
)
INSERT INTO pgoutbox.workers AS w (id, host, pid, version, queues, concurrency, in_flight,
    heartbeat_interval_s, started_at, heartbeat_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now())
ON CONFLICT (id) DO UPDATE SET
    queues = excluded.queues, concurrency = excluded.concurrency, in_flight = excluded.in_flight,
    heartbeat_interval_s = excluded.heartbeat_interval_s, heartbeat_at = now()`

// Heartbeat writes b as its worker's row (one statement) and prunes the
// rows of dead workers.
func Heartbeat(ctx context.Context, db DBTX, b WorkerBeat) error {
	_, err := db.Exec(ctx, heartbeatSQL, b.ID, b.Host, b.PID, b.Version, b.Queues, b.Concurrency,
		b.InFlight, b.Interval.Seconds(), b.StartedAt, WorkerStaleBeats)
	return MapError(err)
}

// DeleteWorker deletes a worker's row (its clean stop).
func DeleteWorker(ctx context.Context, db DBTX, id string) error {
	_, err := db.Exec(ctx, `DELETE FROM pgoutbox.workers WHERE id = $1`, id)
	return MapError(err)
}

// LiveWorker is a worker's row as read back, with ages on the database
// clock.
type LiveWorker struct {
	WorkerBeat
	// HeartbeatAge is now() minus the last heartbeat.
	HeartbeatAge time.Duration
	// Uptime is now() minus StartedAt.
	Uptime time.Duration
}

const liveWorkersSQL = `
SELECT id, host, pid, version, queues, concurrency, in_flight, heartbeat_interval_s, started_at,
       extract(epoch FROM now() - heartbeat_at)::float8, extract(epoch FROM now() - started_at)::float8
FROM pgoutbox.workers
WHERE heartbeat_at >= now() - make_interval(secs => heartbeat_interval_s * $1)
ORDER BY host, pid, id`

// LiveWorkers returns the rows of the workers whose last heartbeat is within
// WorkerStaleBeats of their interval, by host, pid and id.
func LiveWorkers(ctx context.Context, db DBTX) ([]LiveWorker, error) {
	rows, err := db.Query(ctx, liveWorkersSQL, WorkerStaleBeats)
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	var out []LiveWorker
	for rows.Next() {
		var w LiveWorker
		var interval, age, up float64
		if err := rows.Scan(&w.ID, &w.Host, &w.PID, &w.Version, &w.Queues, &w.Concurrency, &w.InFlight,
			&interval, &w.StartedAt, &age, &up); err != nil {
			return nil, MapError(err)
		}
		w.Interval = seconds(interval)
		w.HeartbeatAge, w.Uptime = seconds(age), seconds(up)
		out = append(out, w)
	}
	return out, MapError(rows.Err())
}

// UnservedQueue is a queue holding available or leased effects that no
// live worker works.
type UnservedQueue struct {
	Queue     string
	Available int64
	Leased    int64
	// OldestAvailableAge is now() minus the oldest available_at of a due
	// available effect; 0 when none is due.
	OldestAvailableAge time.Duration
}

// unservedQueuesSQL anti-joins the effects with the set of served queues
// (a hash of a few names), so the scan pays one probe per effect.
const unservedQueuesSQL = `
WITH served AS (
    SELECT DISTINCT unnest(w.queues) AS queue FROM pgoutbox.workers w
    WHERE w.heartbeat_at >= now() - make_interval(secs => w.heartbeat_interval_s * $1))
SELECT e.queue,
       count(*) FILTER (WHERE e.state = 'available'),
       count(*) FILTER (WHERE e.state = 'leased'),
       coalesce(extract(epoch FROM now() - min(e.available_at)
           FILTER (WHERE e.state = 'available' AND e.available_at <= now())), 0)::float8
FROM pgoutbox.effects e
WHERE e.state IN ('available', 'leased')
  AND NOT EXISTS (SELECT 1 FROM served s WHERE s.queue = e.queue)
GROUP BY e.queue
ORDER BY e.queue`

// UnservedQueues returns, by queue name, the queues holding available or
// leased effects that no live worker (LiveWorkers) works.
func UnservedQueues(ctx context.Context, db DBTX) ([]UnservedQueue, error) {
	rows, err := db.Query(ctx, unservedQueuesSQL, WorkerStaleBeats)
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	var out []UnservedQueue
	for rows.Next() {
		var u UnservedQueue
		var oldest float64
		if err := rows.Scan(&u.Queue, &u.Available, &u.Leased, &oldest); err != nil {
			return nil, MapError(err)
		}
		u.OldestAvailableAge = seconds(oldest)
		out = append(out, u)
	}
	return out, MapError(rows.Err())
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
