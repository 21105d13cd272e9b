package store

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestWithoutJIT: what Stats and the console's stream lists run in has jit
// off (their pgoutbox.stream_pending reads are estimated far above their
// cost: compiling one took 1.3 of the 1.5 s a status of 50,000 pending
// stream effects took), in a transaction of its own, and leaves the pooled
// session's jit as it was.
func TestWithoutJIT(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SET jit = on`); err != nil {
		t.Fatal(err)
	}
	var inside string
	err = withoutJIT(ctx, conn, func(q DBTX) error {
		return q.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&inside)
	})
	if err != nil || inside != "off" {
		t.Fatalf("jit inside withoutJIT: %q, %v; want off", inside, err)
	}
	var after string
	if err := conn.QueryRow(ctx, `SELECT current_setting('jit')`).Scan(&after); err != nil || after != "on" {
		t.Fatalf("jit after withoutJIT: %q, %v; want on again", after, err)
	}
}
