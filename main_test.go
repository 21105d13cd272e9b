package pgoutbox_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain())
	}
	pgtest.Main(m, func() error { return goleak.Find() })
}

// bundle is what a test gets from setup.
type bundle struct {
	pool *pgxpool.Pool
	dsn  string
	ctx  context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewBundle(t, 90*time.Second)
	pool, dsn, ctx := db.Pool, db.DSN, db.Ctx
	return &bundle{pool: pool, dsn: dsn, ctx: ctx}
}

// startClient starts a client and stops it at cleanup.
func (b *bundle) startClient(t *testing.T, cfg pgoutbox.Config) *pgoutbox.Client {
	t.Helper()
	if cfg.BackoffCap == 0 {
		cfg.BackoffCap = time.Millisecond // retries are immediate in tests unless a test says otherwise
	}
	cfg.Queues = withTestStorage(cfg.Queues)
	c, err := pgoutbox.NewClient(b.pool, cfg)
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
			t.Errorf("stop: %v", err)
		}
	})
	return c
}

// storageEnv names the storage (pgoutbox.Storage) that startClient gives
// every queue that does not choose one: the test matrix runs the
// guarantee tests once per storage (`make test-batch`).
const storageEnv = pgtest.StorageEnv

// withTestStorage is queues with storageEnv's storage where none is set,
// and a batch queue with pgtest.LanesEnv's lanes where it sets none.
func withTestStorage(queues map[string]pgoutbox.QueueConfig) map[string]pgoutbox.QueueConfig {
	s := pgoutbox.Storage(pgtest.Storage())
	if s == "" {
		return queues
	}
	out := make(map[string]pgoutbox.QueueConfig, len(queues))
	for name, q := range queues {
		if q.Storage == "" {
			q.Storage = s
		}
		if q.Storage == pgoutbox.StorageBatch && q.Lanes == 0 {
			q.Lanes = pgtest.Lanes()
		}
		out[name] = q
	}
	return out
}

// enqueue writes effects in one committed transaction.
func (b *bundle) enqueue(t *testing.T, effects ...pgoutbox.Effect) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = pgoutbox.EnqueueBatch(b.ctx, tx, effects)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func (b *bundle) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	return pgtest.Scalar(t, b.ctx, b.pool, sql, args...)
}

func (b *bundle) count(t *testing.T) int64 {
	return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`)
}

// row is the externally visible part of an effect.
func (b *bundle) row(t *testing.T, id int64) pgtest.Effect {
	t.Helper()
	return pgtest.ReadEffect(t, b.ctx, b.pool, id)
}

// rowJSON captures a whole row, to prove a write changed nothing.
func (b *bundle) rowJSON(t *testing.T, id int64) string {
	t.Helper()
	return pgtest.EffectJSON(t, b.ctx, b.pool, id)
}

// watcher remembers every event of a subscription, so waiting for one
// effect never loses another's.
type watcher struct {
	ch   <-chan pgoutbox.Event
	seen map[[2]any]pgoutbox.Event
}

func watch(t *testing.T, c *pgoutbox.Client) *watcher {
	ch, done := c.Subscribe(1 << 16)
	t.Cleanup(done)
	return &watcher{ch: ch, seen: map[[2]any]pgoutbox.Event{}}
}

// waitEvent returns the event that put effect id into state, reading events
// until it arrives (or the test's deadline passes).
func (b *bundle) waitEvent(t *testing.T, w *watcher, id int64, state string) pgoutbox.Event {
	t.Helper()
	for {
		if e, ok := w.seen[[2]any{id, pgoutbox.State(state)}]; ok {
			return e
		}
		select {
		case e := <-w.ch:
			w.seen[[2]any{e.EffectID, e.State}] = e
		case <-b.ctx.Done():
			t.Fatalf("effect %d never reached %s", id, state)
		}
	}
}

// waitFor polls the database until cond holds (for conditions written by
// other processes, which cannot send events); it fails at the deadline.
func (b *bundle) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	pgtest.WaitFor(t, b.ctx, what, cond)
}
