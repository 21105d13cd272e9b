package cli

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// application is one of the systems serve and work run on the engine: its
// HTTP routes, its queues and effect types, and any background component.
type application struct {
	// name is shown in logs ("release control plane", "record projection").
	name string
	// routes mounts HTTP handlers (nil: none).
	routes func(httpx.Mux)
	// queues the engine must work for it, and the types it registers.
	queues map[string]pgoutbox.QueueConfig
	types  []pgoutbox.EffectType
	// run, when set, is a background component started with serve/work and
	// stopped by cancelling ctx; it returns when stopped.
	run func(ctx context.Context) error
}

// appDeps is what application constructors receive.
type appDeps struct {
	g    *globals
	pool *pgxpool.Pool
	log  *slog.Logger
	reg  prometheus.Registerer
}

// appConstructor builds an application from the environment. It returns
// (nil, reason) when a required setting is missing: serve logs the reason
// and runs the other applications.
type appConstructor func(ctx context.Context, d appDeps) (*application, string, error)

// applications lists every application, in start order. Applications
// register here, one line each.
var applications = []appConstructor{}

// buildApps constructs the applications and merges their queues and types
// into cfg.
func buildApps(ctx context.Context, d appDeps, cfg *pgoutbox.Config) ([]*application, error) {
	var apps []*application
	for _, ctor := range applications {
		app, missing, err := ctor(ctx, d)
		if err != nil {
			return nil, err
		}
		if app == nil {
			d.log.Warn("application not started", "reason", missing)
			continue
		}
		if cfg.Queues == nil {
			cfg.Queues = map[string]pgoutbox.QueueConfig{}
		}
		for name, q := range app.queues {
			cfg.Queues[name] = q
		}
		cfg.Types = append(cfg.Types, app.types...)
		apps = append(apps, app)
		d.log.Info("application started", "name", app.name, "queues", len(app.queues), "effect_types", len(app.types))
	}
	return apps, nil
}
