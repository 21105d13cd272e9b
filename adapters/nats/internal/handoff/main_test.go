package handoff_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

// bundle is what a test gets from setup: a migrated database of its own.
type bundle struct {
	pool *pgxpool.Pool
	ctx  context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewBundle(t, 90*time.Second)
	return &bundle{pool: db.Pool, ctx: db.Ctx}
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

// expire moves an effect's lease into the past (what waiting out the lease
// would do, without waiting).
func expire(t *testing.T, b *bundle, ids ...int64) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second'
		WHERE id = ANY($1) AND state = 'leased'`, ids); err != nil {
		t.Fatal(err)
	}
}

// The fenced writes a consumer makes (the completion, the start record of
// a non-replay-safe delivery, the lease extension), run here on one lease;
// a write that matches no row is ErrLeaseLost.

func complete(b *bundle, l *handoff.Lease) error { return l.Complete(b.ctx, b.pool) }

func markStarted(b *bundle, l *handoff.Lease) error { return l.MarkStarted(b.ctx, b.pool) }

func extend(b *bundle, l *handoff.Lease, d time.Duration) error { return l.Extend(b.ctx, b.pool, d) }
