package pgoutbox

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/ops"
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
	names := slices.Sorted(maps.Keys(c.queues))
	c.beat = &engine.Heartbeat{DB: c.pool, ID: c.cfg.ID, Interval: c.cfg.HeartbeatInterval, Log: c.log, Started: time.Now(),
		Queues: func() ([]string, []int32, int) {
			conc, inFlight := make([]int32, len(names)), 0
			for i, name := range names {
				q := c.queues[name]
				conc[i] = int32(q.cfg.Concurrency)
				inFlight += q.delivering()
			}
			return names, conc, inFlight
		}}
	if c.cfg.HeartbeatInterval > 0 {
		c.life.Service(c.beat.Run)
	}
	if c.cfg.SampleInterval > 0 {
		reg := prometheus.NewRegistry()
		reg.MustRegister(c.m.deliveries, c.m.claimLatency, c.m.claimed)
		sampler := ops.NewSampler(c.pool, ops.NewStatsCache(c.pool, ops.StatusOptions{}, 0), ops.RegistrySource(reg),
			ops.SamplerConfig{Worker: c.cfg.ID, Interval: c.cfg.SampleInterval, Logger: c.log})
		c.life.Service(func(ctx context.Context) { _ = sampler.Run(ctx) })
	}
}
