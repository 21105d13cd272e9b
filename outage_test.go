package pgoutbox_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// A row-lock batch whose connection dies before it commits is one event:
// one WARN line with the batch's count, not one "lease lost" line per
// effect (at PostgreSQL's restart under load, one batch read as nine
// faults). Its effects still report lease_lost and are delivered again.
func TestRowLockBatchLossLogsOneLine(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := newLogCapture()
	var calls [5]atomic.Int64
	keys := []string{"fast1", "fast2", "fast3", "fails", "slow"}
	ids := b.enqueue(t, // before the client starts: one claim, one batch
		pgoutbox.Effect{Queue: "q", Type: "t", Key: keys[0]},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: keys[1]},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: keys[2]},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: keys[3]},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: keys[4]},
	)
	var fastDone atomic.Int64
	allFast, release := make(chan struct{}), make(chan struct{})
	c := b.startClient(t, pgoutbox.Config{
		Logger:       logs.Logger(),
		PollInterval: 50 * time.Millisecond,
		Queues:       map[string]pgoutbox.QueueConfig{"q": {Concurrency: 10, RowLockLease: 20 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			i := slices.Index(keys, d.Key)
			first := calls[i].Add(1) == 1
			if first && i < 4 && fastDone.Add(1) == 4 {
				close(allFast)
			}
			switch {
			case first && i == 3:
				return pgoutbox.Retry(context.DeadlineExceeded) // to be promoted at close
			case first && i == 4:
				<-release
			}
			return nil
		}}},
	})
	events := watch(t, c)
	<-allFast
	if n := b.scalar(t, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'idle in transaction' AND backend_xid IS NOT NULL`); n != 1 {
		close(release)
		t.Fatalf("terminated %d claim transactions, want 1", n)
	}
	close(release)
	for _, id := range ids {
		if e := b.waitEvent(t, events, id, ""); e.Outcome != pgoutbox.OutcomeLeaseLost {
			t.Fatalf("effect %d: first outcome %s, want lease_lost", id, e.Outcome)
		}
		b.waitEvent(t, events, id, "completed") // delivered again
	}
	batch := logs.matching(msg("row-lock batch did not commit; its effects stay available and will be delivered again", "q"))
	lost := logs.matching(msg("lease lost; nothing written", ""))
	if len(batch) != 1 || len(lost) != 0 {
		t.Fatalf("%d batch lines and %d lease-lost lines, want 1 and 0", len(batch), len(lost))
	}
	if r := batch[0]; r.Level != slog.LevelWarn || attr(r, "effects").Int64() != 5 {
		t.Fatalf("batch line at %s with effects=%v, want WARN with effects=5", r.Level, attr(r, "effects"))
	}
}

// While the database refuses connections the sweeper logs the outage once
// at its start (ERROR) and once at its end (WARN, with the failed count),
// not once per sweep interval; the heartbeat does the same.
func TestSweeperLogsAnOutageOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	logs := newLogCapture()
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := cfg.ConnConfig.Database
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Logger: logs.Logger(), SweepInterval: 20 * time.Millisecond, PruneInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Stop(context.Background()) }()

	admin, err := pgx.Connect(b.ctx, pgtest.AdminDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	exec := func(sql string) {
		t.Helper()
		if _, err := admin.Exec(b.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	name := pgx.Identifier{db}.Sanitize()
	// The outage: the database refuses new connections and loses the open ones.
	exec(`ALTER DATABASE ` + name + ` ALLOW_CONNECTIONS false`)
	allowed := false
	defer func() {
		if !allowed {
			_, _ = admin.Exec(context.Background(), `ALTER DATABASE `+name+` ALLOW_CONNECTIONS true`)
		}
	}()
	var terminated int64
	if err := admin.QueryRow(b.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&terminated); err != nil {
		t.Fatal(err)
	}
	logs.waitCount(t, b.ctx, "five failed sweeps", 5, func(r slog.Record) bool { return strings.HasPrefix(r.Message, "sweep failed") })
	failed := logs.matching(func(r slog.Record) bool { return r.Level >= slog.LevelError })
	if len(failed) != 1 || failed[0].Message != "sweep failed; retrying every interval (logged once until it succeeds)" {
		var got []string
		for _, r := range failed {
			got = append(got, r.Message)
		}
		t.Fatalf("ERROR lines during the outage: %q, want the sweeper's first failure only", got)
	}
	exec(`ALTER DATABASE ` + name + ` ALLOW_CONNECTIONS true`)
	allowed = true
	resumed := logs.waitCount(t, b.ctx, "the sweeper resumed", 1, msg("sweep resumed", ""))
	if r := resumed[0]; r.Level != slog.LevelWarn || attr(r, "failed_attempts").Int64() < 5 {
		t.Fatalf("resumed line at %s with failed_attempts=%v, want WARN with at least 5", r.Level, attr(r, "failed_attempts"))
	}
}
