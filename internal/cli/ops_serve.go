package cli

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// startOps wires operations into a serve or work process: it registers the
// database-derived gauges (one cached aggregate query per refresh) on reg.
// The aggregate samples `readiness broker` reads and the worker's heartbeat
// row are the Client's own (Config.SampleInterval, HeartbeatInterval), so
// every process that runs workers writes them, the demo's included.
func startOps(g *globals, pool *pgxpool.Pool, reg *prometheus.Registry) {
	cache := ops.NewStatsCache(pool, ops.StatusOptions{
		StalledAfter: envMinutes("OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES", ops.StalledAfterDefault),
	}, 0)
	reg.MustRegister(ops.NewCollector(cache, g.logger()))
}
