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
	// guesses limits the wrong bearer tokens (PGOUTBOX_API_TOKEN,
	// CRON_SECRET) one client address may present: 5 per 5 minutes
	// (httpx.GuessesMaxDefault, GuessWindowDefault), shared by every route.
	guesses *httpx.GuessLimiter
}

// New builds the application. Targets are those whose configuration is set
// (Config.Solr, Config.SPARQL); with none, the records API still works and
// effects wait in the queue until a target is turned on.
func New(pool *pgxpool.Pool, cfg Config) (*App, error) {
	if pool == nil {
		return nil, fmt.Errorf("projection: New: pool is nil")
	}
	cfg = cfg.withDefaults()
	a := &App{cfg: cfg, pool: pool, guesses: httpx.NewGuessLimiter(0, 0, nil)}
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
	m.Handle("POST /api/records", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", a.guesses, http.HandlerFunc(a.postRecord)))
	m.Handle("GET /api/records/{id}", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", a.guesses, http.HandlerFunc(a.getRecord)))
	m.Handle("GET /api/records", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", a.guesses, http.HandlerFunc(a.searchRecords)))
	m.Handle("POST /api/import", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", a.guesses, http.HandlerFunc(a.postImport)))
	m.Handle("GET /api/cron/outbox", a.requireCronSecret(http.HandlerFunc(a.cron)))
}

// requireCronSecret checks "Authorization: Bearer $CRON_SECRET" (SHA-256
// digests compared in constant time, counted against the client's budget of
// wrong tokens, shared with the API's): 401 with WWW-Authenticate: Bearer to
// anything else, 429 once the budget is spent, 503 while CRON_SECRET is
// unset.
func (a *App) requireCronSecret(next http.Handler) http.Handler {
	return httpx.RequireBearer(a.cfg.CronSecret, "CRON_SECRET", a.guesses, next)
}
