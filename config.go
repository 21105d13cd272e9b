package pgoutbox

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Defaults of Config and QueueConfig. Each is used when the field is zero.
const (
	// LeaseDurationDefault is how long a claim is owned before a sweeper may
	// recover it; leases are extended while a delivery runs.
	LeaseDurationDefault = 60 * time.Second
	// DeliveryTimeoutDefault bounds one delivery; it must stay below the lease.
	DeliveryTimeoutDefault = 30 * time.Second
	// PollIntervalDefault is the polling fallback when no NOTIFY arrives.
	PollIntervalDefault = time.Second
	// SweepIntervalDefault is how often expired leases are recovered.
	SweepIntervalDefault = 5 * time.Second
	// SweepBatchDefault is the most leases one sweep statement recovers.
	SweepBatchDefault = 1000
	// CompletedRetentionDefault keeps completed effects this long
	// (OUTBOX_COMPLETED_RETENTION).
	CompletedRetentionDefault = 24 * time.Hour
	// KeyRetentionDefault keeps an idempotency key this long after it was
	// first enqueued, even once its effect was pruned
	// (OUTBOX_KEY_RETENTION): within it, the same key never creates a
	// second effect.
	KeyRetentionDefault = 7 * 24 * time.Hour
	// PruneIntervalDefault is how often completed effects are pruned.
	PruneIntervalDefault = time.Minute
	// PruneBatchDefault is the most rows one prune statement deletes.
	PruneBatchDefault = 1000
	// HeartbeatIntervalDefault is how often a Client with queues writes its
	// row in pgoutbox.workers (docs/operations.md "Live workers").
	HeartbeatIntervalDefault = 10 * time.Second
	// SampleIntervalDefault is how often a Client with queues writes its
	// aggregate samples (pgoutbox.samples, read by `readiness broker` and
	// the console's charts).
	SampleIntervalDefault = 10 * time.Second
	// CompletionBatchDefault is the most completions in one group commit.
	CompletionBatchDefault = 1000
	// ConcurrencyDefault is a queue's number of concurrent deliveries.
	ConcurrencyDefault = 10
	// BackoffCapDefault caps the retry backoff (2^attempt seconds, jitter
	// included).
	BackoffCapDefault = 300 * time.Second
	// RetryAfterCap bounds the delay a handler asks for with RetryAfter (a
	// Retry-After header, a rate-limit reset): a longer delay is cut to
	// RetryAfterCap (one hour), or to BackoffCap when that is larger, so one
	// bad header cannot park an effect for years.
	RetryAfterCap = engine.RetryAfterCap
	// RowLockLeaseDefault is a queue's row-lock lease when
	// QueueConfig.RowLockLease is zero (OUTBOX_ROW_LOCK_LEASE): replay-safe
	// effects are leased by the claim transaction's row lock for up to 50
	// ms (or half the queue's DeliveryTimeout when that is shorter).
	RowLockLeaseDefault = 50 * time.Millisecond
	// RowLockLeaseOff, as QueueConfig.RowLockLease (any negative value
	// does the same), turns row-lock leases off: every claim writes a
	// durable lease.
	RowLockLeaseOff time.Duration = -1
)

// Handler delivers one effect to the outside world. Its error is the outcome:
// nil for success (with optional transitions registered by
// Delivery.OnComplete), or an error built with Retry, RetryAfter, Permanent or
// Ambiguous. An unclassified error is a retry for a replay-safe type and
// ambiguous otherwise. The context ends at the delivery timeout, when the lease
// is lost, or at a hard stop. Its signature is
// func(ctx context.Context, d *Delivery) error.
type Handler = engine.Handler

// PageHandler delivers several effects of one replay-safe type in one call,
// for targets that take them in bulk (an index's update request, a bulk
// publish) and for throughput: a batch queue (QueueConfig.Storage) calls it
// once per page with that page's effects of the type that may run from the
// batch (an ordering key's first), and every other path (row storage,
// retries, a promoted or replayed effect, (*Lease).Deliver) calls it with
// one. It returns one error per delivery, in the order of ds as called,
// each classified like a Handler's; nil for all succeeded. Any other
// number of errors, or a panic, fails every delivery of the call. The call
// takes one of the queue's Concurrency slots; its context ends at the
// type's timeout (the whole call's), at a hard stop, or when the batch's
// lease is lost. A call still running after PageHold has each of its
// effects promoted to a durable lease, as a Handler's is, and a lost one of
// those leases cancels the call. Its one span, "process <queue>", is linked
// to each enqueue's span and carries messaging.batch.message_count. Its
// signature is
// func(ctx context.Context, ds []*Delivery) []error.
type PageHandler = engine.PageHandler

// TxHandler runs an internal job inside the transaction that marks it
// completed: its writes and the completion commit together, fenced by the
// lease. An error rolls the transaction back and is classified like a
// Handler's. Its signature is
// func(ctx context.Context, tx pgx.Tx, d *Delivery) error.
type TxHandler = engine.TxHandler

// EffectType registers how an effect type is delivered. Replay safety is
// decided here, never by the enqueuer. Its fields:
//
//   - Name string: the effect_type value, e.g. "github.check_run.create".
//   - ReplaySafe bool: types that may be delivered more than once
//     (at-least-once, the target dedups by key). A type that is not
//     replay-safe gets delivery_started_at committed before its handler
//     runs, and an unknown outcome sends it to reconciliation_required,
//     never back to available.
//   - Handler Handler: delivers an external effect. Exactly one of
//     Handler, PageHandler and TxHandler is set.
//   - PageHandler PageHandler: delivers external effects several at a time
//     (see PageHandler); the type must be ReplaySafe.
//   - TxHandler TxHandler: runs an internal job inside its completion
//     transaction.
//   - Timeout time.Duration: bounds one delivery of this type, overriding
//     the queue's DeliveryTimeout; it must be below Config.LeaseDuration.
//     Default zero: the queue's DeliveryTimeout.
//   - OrderingMovesOn bool: what a dead letter of this type does to the
//     later effects of its ordering key (Effect.OrderingKey): false (the
//     default, strict) holds them back until the dead letter is replayed
//     and delivered (or deleted); true lets the key move on, and the dead
//     letter, if replayed, is delivered after the effects that overtook it.
//     The choice is per queue: a Client with queues records its types'
//     choice for each of its queues in the database
//     (pgoutbox.ordering_choices) when it starts, and so do the NATS relay
//     and consumer; every claimer, and the operator commands, read it from
//     there. A start that changes a queue's recorded choice is logged (see
//     RegisterOrdering): give a type one choice per queue.
type EffectType = engine.EffectType

// QueueConfig sizes one queue's worker pool.
type QueueConfig struct {
	// Concurrency is the most deliveries of the queue in flight at once,
	// from rows and from batch pages together; default ConcurrencyDefault
	// (10).
	Concurrency int
	// ClaimBatch is the most effects one claim statement leases; default
	// Concurrency. A claim never takes more than the free slots.
	ClaimBatch int
	// RowLockLease is how long a claim transaction may hold this queue's
	// replay-safe effects by their row locks: an effect whose handler
	// succeeds within it costs one tuple write (available → completed)
	// instead of two, and the rest become ordinary durable leases when the
	// batch closes (see rowlock.go). Effects that are not replay-safe
	// always take a durable lease (delivery_started_at committed first).
	// Default RowLockLeaseDefault (50 ms), or half of DeliveryTimeout when
	// that is shorter; it must be below DeliveryTimeout. RowLockLeaseOff
	// (or any negative value) turns row-lock leases off: every claim writes
	// a durable lease (for long handlers, which would be promoted anyway,
	// or to keep no transaction open while handlers run, e.g. behind a
	// transaction pooler with a short idle-in-transaction timeout).
	RowLockLease time.Duration
	// ClaimCooldown, when positive, lets the claim loop wait up to this long
	// after its previous claim for more slots to free before it claims a
	// partial batch (fewer than min(Concurrency, ClaimBatch) effects): small
	// pools then claim and commit fuller batches, at the price of up to this
	// much delivery latency. A full batch is never delayed. Default 0: claim
	// as soon as one slot frees. A millisecond or two is typical.
	ClaimCooldown time.Duration
	// DeliveryTimeout bounds one delivery; default DeliveryTimeoutDefault
	// (30 s), or half the lease when that is shorter. It must be below
	// Config.LeaseDuration.
	DeliveryTimeout time.Duration
	// Storage is how the queue keeps its effects (docs/batch-storage.md),
	// recorded in the database when the Client starts, so that every
	// enqueue and every claimer agrees. Default "" (leave the recorded
	// choice as it is; a queue never recorded uses StorageRows). The Client
	// reads the recorded storage again at each sweep (SweepInterval), so a
	// queue switched by SetStorage while it runs is delivered the new way;
	// a queue switched back to StorageRows is still delivered from its
	// stream, by the Client's batch loop, until the stream holds none of
	// its effects.
	Storage Storage
	// PageSize is, for a StorageBatch queue, the most effects one page of a
	// batch reads and settles in one transaction; default PageSizeDefault
	// (1,000).
	PageSize int
	// PageHold is, for a StorageBatch queue, how long a page waits for its
	// slowest handlers: the ones still running then are promoted to
	// durable leases in pgoutbox.effects and the page settles, so a slow
	// handler holds its queue's batches up for PageHold at most. Default
	// PageHoldDefault (1 s), or half of DeliveryTimeout when that is
	// shorter.
	PageHold time.Duration
	// Lanes is, for a StorageBatch queue, how many consumers may deliver
	// it at once (docs/batch-storage.md "Lanes"): each tick splits the
	// queue's new effects into one batch per lane by a hash of their
	// ordering key (of their id when they have none), and each Client
	// leases one batch at a time, so several Clients deliver different
	// lanes while one key's effects stay in order in their lane. Recorded
	// in the database when the Client starts, with Storage (which must be
	// set); 1 to LanesMax. Default 0 (leave the recorded count as it is;
	// a queue never recorded has 1 lane). Raise it only once every Client
	// of the queue runs a version that knows lanes (migration 00031).
	Lanes int
}

// LanesMax is the most lanes a batch queue may have (QueueConfig.Lanes).
const LanesMax = 64

// Storage is a queue's storage (QueueConfig.Storage).
type Storage string

const (
	// StorageRows keeps one row per effect in pgoutbox.effects, updated at
	// each step of its life: every effect's states and attempts are
	// visible at once.
	StorageRows Storage = store.StorageRows
	// StorageBatch appends effects to pgoutbox.stream and delivers them in
	// batches closed by snapshot ticks, writing nothing per successful
	// effect; retries, dead letters and effects that must not run from a
	// batch (types that are not replay-safe, internal jobs, effects not yet
	// due, effects behind a held ordering key) move to pgoutbox.effects.
	StorageBatch Storage = store.StorageBatch
)

// Batch queues' defaults (QueueConfig.PageSize, QueueConfig.PageHold).
const (
	// PageSizeDefault is a batch queue's page size.
	PageSizeDefault = 1000
	// PageHoldDefault is how long a batch queue's page waits for its
	// handlers before it promotes the slow ones.
	PageHoldDefault = time.Second
)

// Config configures a Client. Zero fields take the documented defaults.
type Config struct {
	// ID names this worker in lease_owner; default "<hostname>-<pid>-<random>".
	ID string
	// Queues are the queues this client claims from, by name, each with its
	// worker pool. Default none: a Client with no queues delivers nothing
	// and only runs maintenance (sweeper and pruning).
	Queues map[string]QueueConfig
	// Types are the effect types this client delivers, each with its
	// handler; a name may appear once. Default none. An effect whose type
	// is not registered here but is claimed from one of Queues fails like
	// a retry, and is dead-lettered when its attempts run out.
	Types []EffectType
	// Logger receives structured logs. Default: the records at WARN and
	// above (failed claims, an unreachable database, failed deliveries, a
	// transaction pooler without SessionURL) go to slog.Default() as it is
	// when NewClient runs; to discard everything, pass
	// slog.New(slog.DiscardHandler).
	Logger *slog.Logger
	// Registerer receives the client's Prometheus metrics
	// (docs/operations.md). Default nil: no metrics are registered.
	Registerer prometheus.Registerer
	// LeaseDuration is how long a claim is owned before a sweeper may
	// recover it; the client extends the leases of running deliveries every
	// LeaseDuration/3. At least 1 s; default LeaseDurationDefault (60 s).
	LeaseDuration time.Duration
	// PollInterval is how often an idle claim loop polls when no NOTIFY
	// arrives (a fallback: inserts notify). Default PollIntervalDefault
	// (1 s).
	PollInterval time.Duration
	// SweepInterval is how often this client recovers expired leases and
	// parks and un-parks the waiting effects of blocked ordering keys
	// (docs/ordering.md, "Parking"; also once at Start). Default
	// SweepIntervalDefault (5 s); negative disables the sweeper in this
	// client (another client, or Client.Sweep, must then sweep).
	SweepInterval time.Duration
	// SweepBatch is the most expired leases (or parked, un-parked effects)
	// one sweep statement handles. Default SweepBatchDefault (1000).
	SweepBatch int
	// CompletedRetention is how long a completed effect is kept before
	// pruning deletes it; dead_letter and reconciliation_required effects
	// are never pruned. Default CompletedRetentionDefault (24 h).
	CompletedRetention time.Duration
	// KeyRetention default KeyRetentionDefault (7 days), or
	// CompletedRetention when that is longer: how long after its first
	// enqueue an idempotency key is remembered, whether or not its effect
	// still exists; it must not be shorter than CompletedRetention. Pruned
	// with the completed effects (PruneInterval).
	KeyRetention time.Duration
	// PruneInterval is how often this client prunes completed effects,
	// expired keys and the NOTIFY limiter's rows of gone backends. Default PruneIntervalDefault (1 min); negative disables
	// pruning in this client.
	PruneInterval time.Duration
	// PruneBatch is the most rows one prune statement deletes. Default
	// PruneBatchDefault (1000).
	PruneBatch int
	// HeartbeatInterval is how often a Client with queues upserts its row
	// in pgoutbox.workers (id, host, pid, queues, concurrency, deliveries
	// in flight): one statement per interval, which also deletes the rows
	// of workers silent for 3 of their intervals. The row is written at
	// Start and deleted at Stop. Default HeartbeatIntervalDefault (10 s);
	// negative disables it (the operator's live-worker list and the
	// console's "no live worker serves this queue" then miss this process).
	HeartbeatInterval time.Duration
	// SampleInterval is how often a Client with queues writes one aggregate
	// sample per queue it worked (claims, completions, transient failures,
	// claim latency p99, oldest available age) to pgoutbox.samples, pruned
	// after 24 h. Default SampleIntervalDefault (10 s); negative disables
	// it. The CLI reads it from OUTBOX_SAMPLE_INTERVAL.
	SampleInterval time.Duration
	// CompletionBatch is the most completions the group committer writes
	// in one statement. Default CompletionBatchDefault (1000).
	CompletionBatch int
	// BackoffCap caps the retry backoff (2^attempt s ±10 %, the cap
	// applied after the jitter). Default BackoffCapDefault (300 s).
	BackoffCap time.Duration
	// DisableListen turns LISTEN/NOTIFY off: the claim loops poll every
	// PollInterval. Default false: the client listens on the channel
	// pgoutbox_effects, on which an enqueue announces its queue.
	DisableListen bool
	// SessionURL is a connection string to the same database on which a
	// connection is a session of its own: PostgreSQL directly, or a pooler
	// in session mode. The listener LISTENs there. Set it when the pool
	// goes through a transaction-pooling proxy (PgBouncer in transaction
	// mode, Supabase's and Neon's poolers, RDS Proxy), where LISTEN cannot
	// work: without it the client polls (and says so once, at WARN). Start
	// fails when SessionURL itself goes through such a proxy. Default
	// empty: the listener connects with the pool's configuration. The CLI
	// reads it from PGOUTBOX_SESSION_DATABASE_URL. See docs/poolers.md.
	SessionURL string
	// TracerProvider makes the client's delivery spans (docs/operations.md,
	// "Tracing"): one CONSUMER span "process <queue>" per delivery,
	// continuing the trace of the enqueue. Default
	// otel.GetTracerProvider(), the global provider, a no-op until the
	// application installs an SDK.
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() (Config, error) {
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Logger == nil {
		c.Logger = slog.New(minLevel{h: slog.Default().Handler(), min: slog.LevelWarn})
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defi := func(d *int, v int) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.LeaseDuration, LeaseDurationDefault)
	def(&c.PollInterval, PollIntervalDefault)
	def(&c.SweepInterval, SweepIntervalDefault)
	def(&c.CompletedRetention, CompletedRetentionDefault)
	def(&c.KeyRetention, max(KeyRetentionDefault, c.CompletedRetention))
	def(&c.PruneInterval, PruneIntervalDefault)
	def(&c.BackoffCap, BackoffCapDefault)
	def(&c.HeartbeatInterval, HeartbeatIntervalDefault)
	def(&c.SampleInterval, SampleIntervalDefault)
	defi(&c.SweepBatch, SweepBatchDefault)
	defi(&c.PruneBatch, PruneBatchDefault)
	defi(&c.CompletionBatch, CompletionBatchDefault)
	if c.LeaseDuration < time.Second {
		return c, fmt.Errorf("pgoutbox: Config.LeaseDuration must be at least 1s, got %s", c.LeaseDuration)
	}
	if c.CompletedRetention < 0 {
		return c, fmt.Errorf("pgoutbox: Config.CompletedRetention must be positive, got %s", c.CompletedRetention)
	}
	if c.KeyRetention < c.CompletedRetention {
		return c, fmt.Errorf("pgoutbox: Config.KeyRetention (%s) must not be shorter than Config.CompletedRetention (%s)",
			c.KeyRetention, c.CompletedRetention)
	}
	if c.PollInterval < 0 {
		return c, fmt.Errorf("pgoutbox: Config.PollInterval must be positive, got %s", c.PollInterval)
	}
	queues := make(map[string]QueueConfig, len(c.Queues))
	for name, q := range c.Queues {
		if name == "" {
			return c, fmt.Errorf("pgoutbox: Config.Queues: empty queue name")
		}
		defi(&q.Concurrency, ConcurrencyDefault)
		defi(&q.ClaimBatch, q.Concurrency)
		defi(&q.PageSize, PageSizeDefault)
		switch q.Storage {
		case "", StorageRows, StorageBatch:
		default:
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].Storage %q: want %q, %q or empty", name, q.Storage,
				StorageRows, StorageBatch)
		}
		def(&q.DeliveryTimeout, min(DeliveryTimeoutDefault, c.LeaseDuration/2))
		def(&q.PageHold, min(PageHoldDefault, q.DeliveryTimeout/2))
		if q.ClaimCooldown < 0 {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].ClaimCooldown (%s) must not be negative", name, q.ClaimCooldown)
		}
		if q.PageHold < 0 {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].PageHold (%s) must not be negative", name, q.PageHold)
		}
		if q.Lanes < 0 || q.Lanes > LanesMax {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].Lanes (%d): want 1 to %d, or 0 to keep the recorded count",
				name, q.Lanes, LanesMax)
		}
		if q.Lanes > 0 && q.Storage == "" {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].Lanes is recorded with Storage: set Storage too", name)
		}
		if q.Concurrency < 0 || q.ClaimBatch < 0 || q.PageSize < 0 {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q]: Concurrency, ClaimBatch and PageSize must be positive", name)
		}
		switch {
		case q.RowLockLease == 0:
			q.RowLockLease = min(RowLockLeaseDefault, q.DeliveryTimeout/2)
		case q.RowLockLease < 0:
			q.RowLockLease = 0 // off: durable leases only
		case q.RowLockLease >= q.DeliveryTimeout:
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].RowLockLease (%s) must be below DeliveryTimeout (%s); negative turns it off",
				name, q.RowLockLease, q.DeliveryTimeout)
		}
		if q.DeliveryTimeout >= c.LeaseDuration {
			return c, fmt.Errorf("pgoutbox: Config.Queues[%q].DeliveryTimeout (%s) must be below Config.LeaseDuration (%s)",
				name, q.DeliveryTimeout, c.LeaseDuration)
		}
		queues[name] = q
	}
	c.Queues = queues
	seen := map[string]bool{}
	for i, t := range c.Types {
		switch {
		case t.Name == "":
			return c, fmt.Errorf("pgoutbox: Config.Types[%d].Name is empty", i)
		case seen[t.Name]:
			return c, fmt.Errorf("pgoutbox: Config.Types: %q registered twice", t.Name)
		case engine.CheckHandlers(t) != nil:
			return c, fmt.Errorf("pgoutbox: Config.Types[%q]: %w", t.Name, engine.CheckHandlers(t))
		case t.Timeout >= c.LeaseDuration:
			return c, fmt.Errorf("pgoutbox: Config.Types[%q].Timeout (%s) must be below Config.LeaseDuration (%s)",
				t.Name, t.Timeout, c.LeaseDuration)
		}
		seen[t.Name] = true
	}
	return c, nil
}

// registerOrdering records, when the client has queues, its registered
// types' ordering choices in each of its queues (RegisterOrdering).
func (c *Client) registerOrdering(ctx context.Context) error {
	if len(c.queues) == 0 {
		return nil
	}
	return RegisterOrdering(ctx, c.pool, slices.Sorted(maps.Keys(c.queues)), c.cfg.Types, c.log)
}

// RegisterOrdering records in the database, for each queue of queues, each
// type's dead-letter choice for ordered keys (EffectType.OrderingMovesOn),
// in pgoutbox.ordering_choices, which every claim reads; rows already right
// are not written, and no other queue's choice changes. A Client with queues
// calls it when it starts, and so do the NATS relay and consumer (adapters/nats)
// and the projection; a program that claims through ClaimLeases or
// ClaimRelay calls it itself (a type never registered in a queue is strict).
//
// A registration that changes a choice already recorded is applied and
// logged on log (a warning naming the queue, the type, both choices and
// when the former one was recorded; nil logs nothing), not refused: in a
// rolling deploy that changes a type's choice the new instances must start
// while the old ones still run. Give one type one choice per queue: while
// two sets of processes register different choices, each start flips it.
func RegisterOrdering(ctx context.Context, db DB, queues []string, types []EffectType, log *slog.Logger) error {
	if len(types) == 0 || len(queues) == 0 {
		return nil
	}
	names, moveOn := make([]string, len(types)), make([]bool, len(types))
	for i, t := range types {
		names[i], moveOn[i] = t.Name, t.OrderingMovesOn
	}
	changed, err := store.SetOrderingChoices(ctx, db, queues, names, moveOn)
	if err != nil {
		return fmt.Errorf("pgoutbox: record the effect types' ordering choices: %w", err)
	}
	if log != nil {
		for _, ch := range changed {
			log.Warn("ordering choice of an effect type changed in its queue; processes that register the former choice change it back when they start",
				"queue", ch.Queue, "effect_type", ch.Type, "dead_letter", orderingChoice(ch.MovesOn),
				"former", orderingChoice(!ch.MovesOn), "former_since", ch.FormerSince)
		}
	}
	return nil
}

// orderingChoice names an ordering choice in logs.
func orderingChoice(movesOn bool) string {
	if movesOn {
		return "moves on"
	}
	return "strict"
}

// minLevel passes on the records of h at min and above: the default Logger,
// so that a client nobody configured logging for is not silent about what
// stops it from working.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}

func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }

func (m minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h: m.h.WithAttrs(as), min: m.min}
}

func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h: m.h.WithGroup(name), min: m.min}
}
