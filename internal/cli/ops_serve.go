package cli

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// startOps wires operations into a serve or work process: it registers the
// database-derived gauges (one cached aggregate query per refresh) on reg
// and starts the sampler that persists the aggregate samples `readiness
// broker` reads, using the engine's instruments on reg. worker names this
// process in the samples (the Client's ID). Call it before the Client
// starts and call the returned function to stop the sampler:
//
//	defer startOps(ctx, g, pool, reg, client.ID())()
func startOps(ctx context.Context, g *globals, pool *pgxpool.Pool, reg *prometheus.Registry, worker string) (stop func()) {
	log := g.logger()
	cache := ops.NewStatsCache(pool, ops.StatusOptions{
		StalledAfter: envMinutes("OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES", ops.StalledAfterDefault),
	}, 0)
	reg.MustRegister(ops.NewCollector(cache, log))
	sampler := ops.NewSampler(pool, cache, ops.RegistrySource(reg), ops.SamplerConfig{
		Worker:   worker,
		Interval: envDuration("OUTBOX_SAMPLE_INTERVAL", ops.SampleIntervalDefault),
		Logger:   log,
	})
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sampler.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
