package cli

// The record projection's wiring into serve and work (package projection):
// its routes (/api/records, /api/import, /api/cron/outbox, /workers), and,
// when a target is on, the outbox_events queue and the record.upsert type.

import (
	"context"
	"os"

	"github.com/pgoutbox/pgoutbox/projection"
)

// projectionFromEnv reads the projection's settings. A target switched on
// with missing settings stays off and is logged with the missing setting;
// the rest of the projection still runs.
func projectionFromEnv(d appDeps) projection.Config {
	cfg, err := projection.FromEnv(os.Getenv)
	if err != nil {
		d.log.Warn("record projection target not started", "reason", err.Error())
	}
	cfg.Logger = d.log
	return cfg
}

// projectionApp is the record projection for serve and work. Its records
// API needs only the database (and PGOUTBOX_API_TOKEN, without which those
// routes answer 503), so it always starts; with no target enabled it
// registers no queue and claims nothing.
func projectionApp(_ context.Context, d appDeps) (*application, string, error) {
	cfg := projectionFromEnv(d)
	app, err := projection.New(d.pool, cfg)
	if err != nil {
		return nil, "", err
	}
	if !app.Enabled() {
		d.log.Info("record projection: no target enabled; records wait in outbox_events",
			"solr", cfg.Disabled[projection.TargetSolr], "graphdb", cfg.Disabled[projection.TargetGraphDB])
	}
	return &application{
		name:       "record projection",
		routes:     app.Routes,
		projection: app,
		queues:     app.Queues(),
		types:      app.EffectTypes(),
	}, "", nil
}
