package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PollInterval is how often WaitFor checks its condition.
const PollInterval = 20 * time.Millisecond

// Bundle is the start of every package's test bundle: a fresh migrated
// database's pool and DSN, and a context that bounds the test.
type Bundle struct {
	Pool *pgxpool.Pool
	DSN  string
	// Ctx ends after the timeout given to NewBundle, or at cleanup.
	Ctx context.Context
}

// NewBundle makes a fresh database (NewPool) and a context that ends after
// timeout or when the test ends.
func NewBundle(tb testing.TB, timeout time.Duration) Bundle {
	tb.Helper()
	pool, dsn := NewPool(tb)
	return Bundle{Pool: pool, DSN: dsn, Ctx: Context(tb, timeout)}
}

// Context returns a context that ends after timeout or when the test ends.
func Context(tb testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	tb.Cleanup(cancel)
	return ctx
}

// Querier is what Scalar queries: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Scalar runs sql, which selects one integer, and returns it; any error
// fails the test.
func Scalar(tb testing.TB, ctx context.Context, db Querier, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := db.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// WaitFor checks cond every PollInterval until it holds, for conditions
// that other processes (or a broker) write and that therefore send no
// event; it fails the test when ctx ends first, naming what it waited for.
func WaitFor(tb testing.TB, ctx context.Context, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}
