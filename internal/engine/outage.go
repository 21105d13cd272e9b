package engine

import (
	"log/slog"
	"time"
)

// Outage logs the failures of a periodic background task (the sweeper, the
// pruner, the heartbeat, the sampler) once per outage, like the claim loop
// and the listener: the first failure at ERROR, the next ones at DEBUG, and
// one WARN line when the task succeeds again, with how many attempts failed
// and for how long. The task retries on its own interval; while the
// database is down there is nothing more to say. Not safe for concurrent
// use: one Outage per task loop.
type Outage struct {
	// Log receives the lines.
	Log *slog.Logger
	// What names the task in the lines: "sweep", "worker heartbeat".
	What string

	failed int // attempts failed since the outage began; 0: none
	since  time.Time
}

// Report records one attempt's result (err nil: it succeeded).
func (o *Outage) Report(err error) {
	switch {
	case err != nil && o.failed == 0:
		o.failed, o.since = 1, time.Now()
		o.Log.Error(o.What+" failed; retrying every interval (logged once until it succeeds)", "err", err)
	case err != nil:
		o.failed++
		o.Log.Debug(o.What+" failed again", "err", err, "failures", o.failed)
	case o.failed > 0:
		o.Log.Warn(o.What+" resumed", "failed_attempts", o.failed, "outage", time.Since(o.since).Round(time.Millisecond))
		o.failed = 0
	}
}
