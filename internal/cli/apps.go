package cli

import (
	"context"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
	"github.com/pgoutbox/pgoutbox/projection"
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
	// projection, when set, is the record projection, whose state the
	// workers page (/workers, internal/console) shows.
	projection *projection.App
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

// buildApps constructs the applications and merges their queues and types
// into cfg.
func buildApps(ctx context.Context, d appDeps, cfg *pgoutbox.Config) ([]*application, error) {
	var apps []*application
	for _, ctor := range applications() {
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

// runComponents starts the applications' background components; the
// returned function cancels them and waits for them to return.
func runComponents(ctx context.Context, apps []*application, log *slog.Logger) (stop func()) {
	bgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	for _, app := range apps {
		if app.run != nil {
			bg.Go(func() {
				if err := app.run(bgCtx); err != nil {
					log.Error("application component stopped", "app", app.name, "err", err)
				}
			})
		}
	}
	return func() { cancel(); bg.Wait() }
}

// engine is what serve and work share: the database, the metrics registry
// (with the Go and process collectors), the engine's configuration and the
// applications merged into it.
type engine struct {
	pool *pgxpool.Pool
	reg  *prometheus.Registry
	cfg  pgoutbox.Config
	apps []*application
	log  *slog.Logger
}

// openEngine opens (and migrates) the database and builds the applications;
// adjust, when set, edits the configuration before the applications join it.
// Close the pool when done.
func (g *globals) openEngine(ctx context.Context, eng *engineFlags, adjust func(*pgoutbox.Config)) (*engine, error) {
	if err := eng.validate(); err != nil {
		return nil, &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	e := &engine{log: g.logger(), reg: prometheus.NewRegistry()}
	pool, _, err := g.open(ctx, true)
	if err != nil {
		return nil, err
	}
	e.pool = pool
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e.cfg = eng.config(g, e.reg)
	if adjust != nil {
		adjust(&e.cfg)
	}
	e.apps, err = buildApps(ctx, appDeps{g: g, pool: pool, log: e.log, reg: e.reg}, &e.cfg)
	if err != nil {
		pool.Close()
		return nil, &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	eng.queueDefaults(&e.cfg)
	return e, nil
}
