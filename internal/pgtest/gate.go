package pgtest

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Gate is a pgx tracer (set it as a ConnConfig's Tracer) that, once armed,
// holds the first statement Match accepts, in the goroutine sending it,
// until Release or until the statement's own context ends, and records
// whether that context had ended. A test of a shutdown that must not cut a
// statement short holds one across the shutdown's start: released, the
// statement must still be sent under a live context. Cut short instead, pgx
// closes the connection in the background (a cancel request, then
// Terminate), so the statement went on running on the server after the
// shutdown returned.
type Gate struct {
	// Match reports whether a statement is the one to hold.
	Match func(sql string) bool

	armed    chan struct{}
	held     chan struct{}
	release  chan struct{}
	done     chan struct{}
	holdOnce sync.Once
	mu       sync.Mutex
	ended    bool
}

// NewGate returns an unarmed Gate that holds the first statement match
// accepts once armed.
func NewGate(match func(sql string) bool) *Gate {
	return &Gate{Match: match, armed: make(chan struct{}), held: make(chan struct{}),
		release: make(chan struct{}), done: make(chan struct{})}
}

// Pool returns a pool on dsn whose connections trace through g, closed
// when tb's cleanups run.
func (g *Gate) Pool(tb testing.TB, dsn string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.Tracer = g
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// Arm makes the next statement Match accepts the one held. Call it once.
func (g *Gate) Arm() { close(g.armed) }

// Held is closed once a statement is being held.
func (g *Gate) Held() <-chan struct{} { return g.held }

// Release lets the held statement (or the one about to be) go. Call it
// once.
func (g *Gate) Release() { close(g.release) }

// Done is closed once the held statement was let go.
func (g *Gate) Done() <-chan struct{} { return g.done }

// Ended reports whether the held statement's context had ended when it was
// let go. Call it after Done is closed.
func (g *Gate) Ended() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ended
}

func (g *Gate) hold(ctx context.Context, sql string) {
	if !g.Match(sql) {
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
	case <-g.release:
	}
	g.mu.Lock()
	g.ended = ctx.Err() != nil
	g.mu.Unlock()
	close(g.done)
}

// TraceQueryStart holds a matching statement.
func (g *Gate) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	g.hold(ctx, d.SQL)
	return ctx
}

// TraceQueryEnd does nothing.
func (g *Gate) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart holds a batch that has a matching statement.
func (g *Gate) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		g.hold(ctx, q.SQL)
	}
	return ctx
}

// TraceBatchQuery does nothing.
func (g *Gate) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd does nothing.
func (g *Gate) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
