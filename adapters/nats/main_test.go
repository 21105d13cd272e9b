package nats_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	pgtest.Main(m, func() error { return goleak.Find() })
}

// bundle is what a test gets from setup: a migrated database of its own and
// an embedded JetStream server of its own.
type bundle struct {
	pool *pgxpool.Pool
	dsn  string
	ctx  context.Context
	url  string
	nc   *natsgo.Conn
	js   jetstream.JetStream
}

func setup(t testing.TB) *bundle {
	t.Helper()
	db := pgtest.NewBundle(t, 3*time.Minute)
	pool, dsn, ctx := db.Pool, db.DSN, db.Ctx
	url := startNATS(t)
	nc, err := natsgo.Connect(url, natsgo.Name("pgoutbox-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{pool: pool, dsn: dsn, ctx: ctx, url: url, nc: nc, js: js}
}

// startNATS runs an embedded NATS server with JetStream (file storage in a
// temporary directory) until the test ends.
func startNATS(t testing.TB) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("embedded NATS server not ready")
	}
	return ns.ClientURL()
}

// testPolicy keeps retries fast: backoffs of at most 100 ms.
var testPolicy = pgnats.RetryPolicy{BackoffCap: 100 * time.Millisecond, LeaseDuration: 3 * time.Second}

func (b *bundle) enqueue(t testing.TB, effects ...pgoutbox.Effect) []int64 {
	t.Helper()
	var ids []int64
	for start := 0; start < len(effects); start += 10_000 {
		end := min(start+10_000, len(effects))
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			got, err := pgoutbox.EnqueueBatch(b.ctx, tx, effects[start:end])
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func (b *bundle) scalar(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	return pgtest.Scalar(t, b.ctx, b.pool, sql, args...)
}

// waitFor polls until cond holds (conditions written by other processes or
// by JetStream cannot send events); it fails at the test's deadline.
func (b *bundle) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, b.ctx, what, cond)
}

// streamState returns the stream's stored message count and last sequence
// (every message ever stored: the stream has work-queue retention).
func (b *bundle) streamState(t testing.TB, name string) (msgs, lastSeq uint64) {
	t.Helper()
	st, err := b.js.Stream(b.ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs, info.State.LastSeq
}

// expire ends the leases of ids now, as if their holder had died long ago.
func (b *bundle) expire(t testing.TB, ids ...int64) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second'
		WHERE id = ANY($1) AND state = 'leased'`, ids); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) startRelay(t testing.TB, cfg pgnats.RelayConfig) *pgnats.Relay {
	t.Helper()
	r, err := pgnats.NewRelay(b.pool, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
	})
	return r
}

func (b *bundle) startConsumer(t testing.TB, cfg pgnats.ConsumerConfig) *pgnats.Consumer {
	t.Helper()
	c, err := pgnats.NewConsumer(b.pool, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("consumer stop: %v", err)
		}
	})
	return c
}

// sweeper is a client that only runs maintenance on demand.
func (b *bundle) sweep(t testing.TB) int {
	t.Helper()
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{SweepInterval: -1, PruneInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Sweep(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// states counts effects by state.
func (b *bundle) states(t testing.TB) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT state::text, count(*) FROM pgoutbox.effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
