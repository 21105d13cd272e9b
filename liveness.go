package pgoutbox

import (
	"context"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/core"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// startLiveness starts, for a Client with queues, the heartbeat that keeps
// its row in pgoutbox.workers (Config.HeartbeatInterval) and the sampler
// that writes its aggregate samples (Config.SampleInterval). Both are
// services: they run until the deliveries have finished, so the last
// heartbeats still count the deliveries a Stop waits for.
func (c *Client) startLiveness() {
	if len(c.queues) == 0 {
		return
	}
	c.started = time.Now()
	if c.cfg.HeartbeatInterval > 0 {
		c.life.Service(c.heartbeatLoop)
	}
	if c.cfg.SampleInterval > 0 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(c.m.deliveries, c.m.claimLatency, c.m.claimed)
		sampler := ops.NewSampler(c.pool, ops.NewStatsCache(c.pool, ops.StatusOptions{}, 0), ops.RegistrySource(reg),
			ops.SamplerConfig{Worker: c.cfg.ID, Interval: c.cfg.SampleInterval, Logger: c.log})
		c.life.Service(func(ctx context.Context) { _ = sampler.Run(ctx) })
	}
}

// heartbeatLoop writes the worker's row now and every HeartbeatInterval
// until ctx ends, then deletes it.
func (c *Client) heartbeatLoop(ctx context.Context) {
	out := core.Outage{Log: c.log, What: "worker heartbeat"}
	out.Report(c.beat(ctx))
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := store.DeleteWorker(dctx, c.pool, c.cfg.ID); err != nil {
				// The row goes stale and another worker's heartbeat prunes it.
				c.log.Warn("could not remove this worker's heartbeat row; it goes stale", "id", c.cfg.ID, "err", err)
			}
			return
		case <-t.C:
			if ctx.Err() == nil {
				out.Report(c.beat(ctx))
			}
		}
	}
}

// beat writes one heartbeat: this process, its queues and the deliveries in
// flight now.
func (c *Client) beat(ctx context.Context) error {
	names := slices.Sorted(maps.Keys(c.queues))
	b := store.WorkerBeat{
		ID: c.cfg.ID, Host: hostname(), PID: os.Getpid(), Version: moduleVersion(),
		Queues: names, Concurrency: make([]int32, len(names)),
		Interval: c.cfg.HeartbeatInterval, StartedAt: c.started,
	}
	for i, name := range names {
		q := c.queues[name]
		b.Concurrency[i] = int32(q.cfg.Concurrency)
		b.InFlight += int(q.inflight.Load())
	}
	return store.Heartbeat(ctx, c.pool, b)
}

func hostname() string {
	h, _ := os.Hostname()
	return h
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
