package engine

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Heartbeat keeps a worker process's row in pgoutbox.workers (migration
// 00026): written when Run starts and every Interval, deleted when Run's
// ctx ends. Run it as a Lifecycle service, so the last beats still count
// the deliveries a Stop waits for.
type Heartbeat struct {
	DB       store.DBTX
	ID       string
	Interval time.Duration
	Log      *slog.Logger
	// Queues returns the queues the process works with their pool sizes
	// (parallel slices) and the deliveries in flight now.
	Queues func() (queues []string, concurrency []int32, inFlight int)
	// Started is when the process started working (the row's started_at).
	Started time.Time
}

// Run beats now and every Interval until ctx ends, then deletes the row.
// A database outage is logged once (Outage). The end of ctx never cuts a
// beat short (it runs under Outlive): cut short, it went on running on the
// server after Run returned, and could write the row again after the
// delete.
func (h *Heartbeat) Run(ctx context.Context) {
	out := Outage{Log: h.Log, What: "worker heartbeat"}
	out.Report(h.finishBeat(ctx))
	t := time.NewTicker(h.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := store.DeleteWorker(dctx, h.DB, h.ID); err != nil {
				// The row goes stale and another worker's heartbeat prunes it.
				h.Log.Warn("could not remove this worker's heartbeat row; it goes stale", "id", h.ID, "err", err)
			}
			return
		case <-t.C:
			if ctx.Err() == nil {
				out.Report(h.finishBeat(ctx))
			}
		}
	}
}

// finishBeat is Beat under Outlive(ctx).
func (h *Heartbeat) finishBeat(ctx context.Context) error {
	fctx, cancel := Outlive(ctx)
	defer cancel()
	return h.Beat(fctx)
}

// Beat writes one heartbeat now.
func (h *Heartbeat) Beat(ctx context.Context) error {
	host, _ := os.Hostname()
	b := store.WorkerBeat{ID: h.ID, Host: host, PID: os.Getpid(), Version: moduleVersion(),
		Interval: h.Interval, StartedAt: h.Started}
	b.Queues, b.Concurrency, b.InFlight = h.Queues()
	return store.Heartbeat(ctx, h.DB, b)
}

// moduleVersion is the pgoutbox module's version in this binary's build
// information ("(devel)" when built inside the module; "" when unknown).
var moduleVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	const path = "github.com/pgoutbox/pgoutbox"
	if bi.Main.Path == path {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return ""
})
