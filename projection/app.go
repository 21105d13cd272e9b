package projection

import (
	"fmt"
	"net/http"
	"sort"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// App is the record projection application: its HTTP routes, its effect
// type and queue, and the projector.
type App struct {
	cfg     Config
	pool    *pgxpool.Pool
	targets []Target
	// orderingRegistered is set once RunBatch has recorded the effect
	// type's ordering choice (pgoutbox.RegisterOrdering), as a Client does
	// once at Start.
	orderingRegistered atomic.Bool
}

// New builds the application. Targets are those whose configuration is set
// (Config.Solr, Config.SPARQL); with none, the records API still works and
// effects wait in the queue until a target is turned on.
func New(pool *pgxpool.Pool, cfg Config) (*App, error) {
	if pool == nil {
		return nil, fmt.Errorf("projection: New: pool is nil")
	}
	cfg = cfg.withDefaults()
	a := &App{cfg: cfg, pool: pool}
	if cfg.Solr != nil {
		c, err := solr.New(*cfg.Solr)
		if err != nil {
			return nil, fmt.Errorf("projection: %w", err)
		}
		a.targets = append(a.targets, solrTarget{c})
	}
	if cfg.SPARQL != nil {
		c, err := sparql.New(*cfg.SPARQL)
		if err != nil {
			return nil, fmt.Errorf("projection: %w", err)
		}
		a.targets = append(a.targets, sparqlTarget{c})
	}
	return a, nil
}

// WithTargets replaces the application's targets (tests, custom targets).
func (a *App) WithTargets(ts ...Target) *App {
	a.targets = ts
	return a
}

// Enabled reports whether at least one target is on.
func (a *App) Enabled() bool { return len(a.targets) > 0 }

// Targets names the enabled targets.
func (a *App) Targets() []string {
	out := make([]string, 0, len(a.targets))
	for _, t := range a.targets {
		out = append(out, t.Name())
	}
	sort.Strings(out)
	return out
}

// EffectTypes is what a pgoutbox.Client must register to work the
// projection: record.upsert (replay-safe) when a target is on, none
// otherwise.
func (a *App) EffectTypes() []pgoutbox.EffectType {
	if !a.Enabled() {
		return nil
	}
	// A record's effects are ordered by record id (records.go); a dead
	// letter lets the record's later versions through: each carries the
	// whole record and replaces it by id, and a replayed older version is
	// refused by the version check.
	return []pgoutbox.EffectType{{
		Name: EffectType, ReplaySafe: true, Handler: a.Handle, OrderingMovesOn: true,
	}}
}

// Queues is the projection's worker pool (outbox_events) when a target is on;
// nil otherwise, so that with no target enabled nothing is claimed.
func (a *App) Queues() map[string]pgoutbox.QueueConfig {
	if !a.Enabled() {
		return nil
	}
	return map[string]pgoutbox.QueueConfig{Queue: {Concurrency: a.cfg.Concurrency}}
}

// Routes mounts the projection's HTTP routes:
//
//	POST /api/records         one record (bearer PGOUTBOX_API_TOKEN)
//	GET  /api/records/{id}    one record
//	GET  /api/records?q=      full-text search (or ?after= paging)
//	POST /api/import          JSON array, NDJSON or CSV
//	GET  /api/cron/outbox     one bounded projection cycle (bearer CRON_SECRET)
//
// The operator's page of the projection, /workers, is the console's
// (internal/console), fed by Status and NextDrain.
func (a *App) Routes(m httpx.Mux) {
	m.Handle("POST /api/records", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", http.HandlerFunc(a.postRecord)))
	m.Handle("GET /api/records/{id}", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", http.HandlerFunc(a.getRecord)))
	m.Handle("GET /api/records", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", http.HandlerFunc(a.searchRecords)))
	m.Handle("POST /api/import", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", http.HandlerFunc(a.postImport)))
	m.Handle("GET /api/cron/outbox", a.requireCronSecret(http.HandlerFunc(a.cron)))
}

// requireCronSecret checks "Authorization: Bearer $CRON_SECRET" (SHA-256
// digests compared in constant time) and answers 401 with WWW-Authenticate:
// Bearer to anything else, including every call while CRON_SECRET is unset.
func (a *App) requireCronSecret(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := httpx.BearerToken(r)
		if !ok || !httpx.TokenMatches(got, a.cfg.CronSecret) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox"`)
			httpx.Error(w, http.StatusUnauthorized, "missing or invalid bearer token")
			return
		}
		next.ServeHTTP(w, r)
	})
}
