package engine_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// The end of its context never cuts a statement of the heartbeat, the
// lease extender or the listener short: cut short, pgx closes the
// connection in the background (a cancel request, then Terminate), so the
// statement went on running on the server after Run returned (a Client's
// Stop left "1 transactions open after Stop": its first heartbeat), and a
// beat could write the worker's row again after Run deleted it. Each case
// holds the loop's first statement (pgtest.Gate) while its context ends,
// then checks it was sent under a live context.
func TestRunLoopsFinishTheStatementInFlight(t *testing.T) {
	t.Parallel()
	discard := slog.New(slog.DiscardHandler)
	cases := []struct {
		name  string
		match func(sql string) bool
		run   func(t *testing.T, g *pgtest.Gate, dsn string) func(ctx context.Context)
	}{
		{"heartbeat", func(sql string) bool { return strings.Contains(sql, "INSERT INTO pgoutbox.workers") },
			func(t *testing.T, g *pgtest.Gate, dsn string) func(ctx context.Context) {
				h := &engine.Heartbeat{DB: g.Pool(t, dsn), ID: "w", Interval: time.Hour, Log: discard, Started: time.Now(),
					Queues: func() ([]string, []int32, int) { return []string{"q"}, []int32{1}, 0 }}
				return h.Run
			}},
		{"extender", func(sql string) bool { return strings.Contains(sql, "unnest($1::bigint[], $2::uuid[], $3::text[])") },
			func(t *testing.T, g *pgtest.Gate, dsn string) func(ctx context.Context) {
				e := &engine.Extender{DB: g.Pool(t, dsn), Leases: &engine.Leases{}, Lease: time.Minute, Log: discard}
				e.Leases.Put(&engine.Held{Fence: store.Fence{ID: 1, Token: uuid.New(), Type: "t"}, Cancel: func(error) {}})
				return func(ctx context.Context) { e.Run(ctx, time.Millisecond) }
			}},
		{"listener", func(sql string) bool { return sql == store.ListenSQL },
			func(t *testing.T, g *pgtest.Gate, dsn string) func(ctx context.Context) {
				cfg, err := pgx.ParseConfig(dsn)
				if err != nil {
					t.Fatal(err)
				}
				cfg.Tracer = g
				l := &engine.Listener{Config: cfg, RetryMax: time.Second, Log: discard, Wake: func(string) {}, WakeAll: func() {}}
				return l.Run
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, dsn := pgtest.NewPool(t)
			g := pgtest.NewGate(tc.match)
			g.Arm()
			run := tc.run(t, g, dsn)
			deadline := pgtest.Context(t, time.Minute)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() { defer close(done); run(ctx) }()
			select {
			case <-g.Held():
			case <-deadline.Done():
				t.Fatalf("the %s sent no statement", tc.name)
			}
			cancel()
			g.Release()
			<-done
			<-g.Done()
			if g.Ended() {
				t.Errorf("the %s's statement in flight when its context ended was sent under that context", tc.name)
			}
			if tc.name == "heartbeat" {
				var n int
				if err := pool.QueryRow(deadline, `SELECT count(*) FROM pgoutbox.workers`).Scan(&n); err != nil || n != 0 {
					t.Errorf("%d worker rows after Run returned (%v), want 0", n, err)
				}
			}
		})
	}
}

// Outlive sets no deadline while ctx lasts (a long prune or sample is not
// cut at FinishTimeout in normal operation), outlives the end of ctx, and
// ends when cancelled.
func TestOutlive(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	out, stop := engine.Outlive(ctx)
	if d, ok := out.Deadline(); ok {
		t.Errorf("deadline %v while ctx lasts", d)
	}
	cancel()
	if err := out.Err(); err != nil {
		t.Errorf("ended with ctx: %v", err)
	}
	stop()
	if out.Err() == nil {
		t.Error("not ended by its cancel")
	}
}
