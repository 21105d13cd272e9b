package controlplane

import (
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// Worker pool sizes of the two queues.
const (
	// JobsConcurrencyDefault is the lifecycle worker's concurrency.
	JobsConcurrencyDefault = 4
	// OutboxConcurrencyDefault is the GitHub effects' concurrency.
	OutboxConcurrencyDefault = 8
)

// App is the release control plane.
type App struct {
	pool *pgxpool.Pool
	cfg  Config
	gh   GitHub
	log  *slog.Logger
	// bodies bounds the webhook bodies held in memory (MaxBufferedBytes).
	bodies *httpx.Budget
	// guesses limits the wrong PGOUTBOX_API_TOKEN bearer tokens one client
	// address may present: 5 per 5 minutes (httpx.GuessesMaxDefault,
	// GuessWindowDefault).
	guesses *httpx.GuessLimiter
}

// New validates cfg and returns the control plane. It refuses an empty
// webhook secret (ErrNoWebhookSecret).
func New(pool *pgxpool.Pool, cfg Config, gh GitHub, log *slog.Logger) (*App, error) {
	return newApp(pool, cfg, gh, log, true)
}

// ForOperations returns the control plane for operator commands (reconcile):
// it serves no webhooks, so it does not need the webhook secret.
func ForOperations(pool *pgxpool.Pool, cfg Config, gh GitHub, log *slog.Logger) (*App, error) {
	return newApp(pool, cfg, gh, log, false)
}

func newApp(pool *pgxpool.Pool, cfg Config, gh GitHub, log *slog.Logger, serving bool) (*App, error) {
	cfg, err := cfg.withDefaults(serving)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &App{pool: pool, cfg: cfg, gh: gh, log: log, bodies: httpx.NewBudget(cfg.MaxBufferedBytes),
		guesses: httpx.NewGuessLimiter(0, 0, nil)}, nil
}

// Routes mounts POST /webhooks/github and POST /api/release-runs.
func (a *App) Routes(mux httpx.Mux) {
	mux.Handle("POST /webhooks/github", http.HandlerFunc(a.ingest))
	mux.Handle("POST /api/release-runs", httpx.RequireBearer(a.cfg.APIToken, "PGOUTBOX_API_TOKEN", a.guesses, http.HandlerFunc(a.startRunAPI)))
}

// Queues are the control plane's queues: lifecycle jobs and GitHub effects,
// leased independently.
func (a *App) Queues() map[string]pgoutbox.QueueConfig {
	return map[string]pgoutbox.QueueConfig{
		QueueJobs:   {Concurrency: JobsConcurrencyDefault},
		QueueOutbox: {Concurrency: OutboxConcurrencyDefault},
	}
}

// Types registers the lifecycle job and the three GitHub effect types.
//
// A release run's GitHub effects share an ordering key (runOrderingKey). A
// dead Check Run create holds the run's later effects (strict: completing a
// Check Run that was never created is pointless; replay it first). A dead
// dispatch or completion lets the run move on: a rerequested Check Run
// starts a new attempt, whose dispatch must not wait for the failed one. A
// dispatch in reconciliation_required holds the run until an operator
// resolves or supersedes it.
func (a *App) Types() []pgoutbox.EffectType {
	return []pgoutbox.EffectType{
		{Name: TypeWebhook, TxHandler: a.applyWebhook},
		{Name: TypeCheckRunCreate, ReplaySafe: true, Handler: a.createCheckRun},
		{Name: TypeWorkflowDispatch, ReplaySafe: false, Handler: a.dispatchWorkflow, OrderingMovesOn: true},
		{Name: TypeCheckRunComplete, ReplaySafe: true, Handler: a.completeCheckRun, OrderingMovesOn: true},
	}
}
