package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The tests of docs/poolers.md: the engine through a real PgBouncer (1.18
// from Debian) in transaction pooling mode.

const poolerWarning = "the pool goes through a transaction-pooling proxy, where LISTEN cannot work: " +
	"claim loops poll instead of waking on NOTIFY; set Config.SessionURL (PGOUTBOX_SESSION_DATABASE_URL) " +
	"to a direct connection string to wake them (docs/poolers.md)"

// pooled is a test database behind a PgBouncer of its own.
type pooled struct {
	*bundle        // pool and dsn go through PgBouncer (exec query mode)
	direct  string // the database's own address: a session
}

func setupPooled(t *testing.T) *pooled {
	t.Helper()
	pooledDSN, direct := pgtest.NewPooledDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, pooledDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &pooled{bundle: &bundle{pool: pool, dsn: pooledDSN, ctx: ctx}, direct: direct}
}

// newStopped is a client that is not started yet, stopped at cleanup.
func (b *bundle) newStopped(t *testing.T, cfg pgoutbox.Config) *pgoutbox.Client {
	t.Helper()
	if cfg.BackoffCap == 0 {
		cfg.BackoffCap = time.Millisecond
	}
	c, err := pgoutbox.NewClient(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return c
}

// Without a session URL the client detects the transaction pooler, polls,
// and says so once at WARN; through the same proxy every effect completes.
// Directly on PostgreSQL the same client says nothing of the kind.
func TestThroughPoolerWithoutSessionURLPollsAndSaysSoOnce(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	logs := newLogCapture()
	c := p.newStopped(t, pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		Logger:       logs.Logger(),
		PollInterval: 50 * time.Millisecond,
	})
	events := watch(t, c)
	if err := c.Start(p.ctx); err != nil {
		t.Fatal(err)
	}
	ids := p.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"}, pgoutbox.Effect{Queue: "q", Type: "t", Key: "b"})
	for _, id := range ids {
		p.waitEvent(t, events, id, "completed")
	}
	warns := logs.matching(msg(poolerWarning, ""))
	if len(warns) != 1 || warns[0].Level != slog.LevelWarn {
		t.Fatalf("%d pooler warnings (want exactly 1 at WARN): %v", len(warns), warns)
	}
	if n := p.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgoutbox-listener'
		AND datname = current_database()`); n != 0 {
		t.Fatalf("%d listeners through a transaction pooler", n)
	}

	// The negative control: the same client on the direct address.
	direct := setup(t)
	dlogs := newLogCapture()
	dc := direct.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types:  []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		Logger: dlogs.Logger(),
	})
	devents := watch(t, dc)
	direct.waitFor(t, "listener connected", func() bool { return listenerCount(t, direct) == 1 })
	id := direct.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	direct.waitEvent(t, devents, id, "completed")
	if n := len(dlogs.matching(msg(poolerWarning, ""))); n != 0 {
		t.Fatalf("a direct connection was taken for a pooler (%d warnings)", n)
	}
}

// With Config.SessionURL the listener LISTENs on the session while every
// claim and completion goes through the pooler: with the poll interval at an
// hour only a NOTIFY can wake the claim loop.
func TestThroughPoolerSessionURLWakesOnNotify(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	logs := newLogCapture()
	c := p.newStopped(t, pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		Logger:       logs.Logger(),
		PollInterval: time.Hour,
		SessionURL:   p.direct,
	})
	events := watch(t, c)
	if err := c.Start(p.ctx); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, "listener connected", func() bool { return listenerCount(t, p.bundle) == 1 })
	id := p.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	p.waitEvent(t, events, id, "completed")
	if n := len(logs.matching(msg(poolerWarning, ""))); n != 0 {
		t.Fatalf("%d pooler warnings with a session URL", n)
	}
}

// What cannot work through a transaction pooler fails Start clearly and
// changes nothing: pgx's default statement cache (named prepared
// statements, which PgBouncer 1.18 cannot route), and a session URL that
// goes through the pooler too.
func TestThroughPoolerRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	id := p.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	before := p.rowJSON(t, id)
	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types:  []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		Logger: slog.New(slog.DiscardHandler),
	}

	cached := strings.Replace(p.dsn, "default_query_exec_mode=exec", "default_query_exec_mode=cache_statement", 1)
	cpool, err := pgxpool.New(p.ctx, cached)
	if err != nil {
		t.Fatal(err)
	}
	defer cpool.Close()
	c, err := pgoutbox.NewClient(cpool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Start(p.ctx)
	if !errors.Is(err, pgoutbox.ErrPreparedStatementsThroughPooler) || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Fatalf("Start through a pooler in cache_statement mode: %v", err)
	}

	withSession := cfg
	withSession.SessionURL = p.dsn // the pooler again
	c, err = pgoutbox.NewClient(p.pool, withSession)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(p.ctx); err == nil || !strings.Contains(err.Error(), "Config.SessionURL goes through a transaction-pooling proxy") {
		t.Fatalf("Start with a pooled SessionURL: %v", err)
	}
	_ = c.Stop(p.ctx) // not started: a no-op
	if after := p.rowJSON(t, id); after != before {
		t.Fatalf("a refused Start changed the effect:\n%s\n%s", before, after)
	}
}

// Every part of the engine through PgBouncer in transaction mode: enqueue,
// claims under durable and row-lock leases, group-committed and
// transactional completions (OnComplete, TxHandler), retries, the sweeper,
// retention and the stand-alone leases.
func TestEngineThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			p := setupPooled(t)
			if _, err := p.pool.Exec(p.ctx, `CREATE TABLE marks (id bigint PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			var failedOnce atomic.Bool
			c := p.newStopped(t, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4, RowLockLease: min(mode.hold, time.Second)}},
				Types: []pgoutbox.EffectType{
					{Name: "ok", ReplaySafe: true, Handler: noop},
					{Name: "flaky", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
						if failedOnce.CompareAndSwap(false, true) {
							return pgoutbox.Retry(errors.New("first attempt fails"))
						}
						return nil
					}},
					{Name: "mark", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
						d.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
							_, err := tx.Exec(ctx, `INSERT INTO marks VALUES ($1)`, d.ID)
							return err
						})
						return nil
					}},
					{Name: "job", TxHandler: func(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
						_, err := tx.Exec(ctx, `INSERT INTO marks VALUES ($1)`, d.ID)
						return err
					}},
					{Name: "dispatch", Handler: noop},
					{Name: "unsure", Handler: func(context.Context, *pgoutbox.Delivery) error {
						return pgoutbox.Ambiguous(errors.New("timeout after sending"))
					}},
				},
				PollInterval:       20 * time.Millisecond,
				SessionURL:         p.direct,
				SweepInterval:      -1,
				PruneInterval:      -1,
				CompletedRetention: time.Hour,
			})
			events := watch(t, c)
			if err := c.Start(p.ctx); err != nil {
				t.Fatal(err)
			}
			var effects []pgoutbox.Effect
			for i := range 50 {
				effects = append(effects, pgoutbox.Effect{Queue: "q", Type: "ok", Key: fmt.Sprint("ok-", i)})
			}
			effects = append(effects,
				pgoutbox.Effect{Queue: "q", Type: "flaky", Key: "flaky"},
				pgoutbox.Effect{Queue: "q", Type: "mark", Key: "mark"},
				pgoutbox.Effect{Queue: "q", Type: "job", Key: "job"},
				pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "dispatch"})
			ids := p.enqueue(t, effects...)
			again := p.enqueue(t, effects[0]) // a duplicate key: nothing new
			if again[0] != ids[0] || p.count(t) != int64(len(effects)) {
				t.Fatalf("duplicate enqueue: id %d (want %d), %d rows", again[0], ids[0], p.count(t))
			}
			for _, id := range ids {
				p.waitEvent(t, events, id, "completed")
			}
			// A reconciliation record, resolved by an operator.
			unsure := p.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "unsure", Key: "unsure"})[0]
			p.waitEvent(t, events, unsure, "reconciliation_required")
			if err := pgoutbox.Resolve(p.ctx, p.pool, unsure, "unsure", map[string]any{"by": "operator"}); err != nil {
				t.Fatalf("resolve through the pooler: %v", err)
			}
			if n := p.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'completed'
				AND resolution->>'by' = 'operator'`, unsure); n != 1 {
				t.Fatal("the resolution was not recorded")
			}
			if n := p.scalar(t, `SELECT count(*) FROM marks`); n != 2 {
				t.Fatalf("%d marks, want 2 (OnComplete and TxHandler)", n)
			}
			if n := p.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE idempotency_key = 'flaky'`); n != 2 {
				t.Fatalf("flaky took %d attempts, want 2", n)
			}

			// The sweeper recovers an expired lease.
			lost := p.enqueue(t, pgoutbox.Effect{Queue: "side", Type: "ok", Key: "lost"})[0]
			ls, err := pgoutbox.ClaimLeases(p.ctx, p.pool, "side", "gone", 1, time.Minute)
			if err != nil || len(ls) != 1 {
				t.Fatalf("claim: %v (%d)", err, len(ls))
			}
			expire(t, p.bundle, lost)
			if n, err := c.Sweep(p.ctx); err != nil || n != 1 {
				t.Fatalf("sweep through the pooler: %d, %v", n, err)
			}
			if r := p.row(t, lost); r.State != "available" {
				t.Fatalf("swept lease: %+v", r)
			}
			// A stand-alone lease completes through the pooler.
			ls, err = pgoutbox.ClaimLeases(p.ctx, p.pool, "side", "again", 1, time.Minute)
			if err != nil || len(ls) != 1 {
				t.Fatalf("reclaim: %v (%d)", err, len(ls))
			}
			if err := ls[0].Complete(p.ctx, p.pool); err != nil {
				t.Fatal(err)
			}

			// Retention: completed effects older than an hour are pruned.
			if _, err := p.pool.Exec(p.ctx, `UPDATE pgoutbox.effects SET completed_at = now() - interval '2 hours'
				WHERE queue = 'q' AND state = 'completed'`); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Prune(p.ctx); err != nil || n != int64(len(effects)+1) {
				t.Fatalf("prune through the pooler: %d, %v; want %d", n, err, len(effects)+1)
			}
			if n := p.count(t); n != 1 {
				t.Fatalf("%d effects left, want the side one", n)
			}
		})
	}
}

// A client whose Logger is left nil is not silent about what stops it from
// working: its WARN and ERROR records reach slog.Default(), and nothing
// below WARN does. Sequential: it replaces slog's default logger, and
// parallel tests only run once the sequential ones are done.
func TestDefaultLoggerReportsWarnings(t *testing.T) {
	p := setupPooled(t)
	logs := newLogCapture()
	old := slog.Default()
	slog.SetDefault(logs.Logger())
	c, err := pgoutbox.NewClient(p.pool, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types:  []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
	})
	slog.SetDefault(old) // NewClient took the default handler as it was
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(p.ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(p.ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(logs.matching(msg(poolerWarning, ""))); n != 1 {
		t.Fatalf("%d pooler warnings through the default logger, want 1", n)
	}
	if below := logs.matching(func(r slog.Record) bool { return r.Level < slog.LevelWarn }); len(below) != 0 {
		t.Fatalf("the default logger passed %d records below WARN, e.g. %q", len(below), below[0].Message)
	}
}
