package pgoutbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
)

// Defect 3 (issue #11): an idempotency key outlives its effect. Retention
// prunes a completed effect after CompletedRetention, but enqueuing its key
// again returns the pruned effect's id and writes nothing, until the key is
// older than KeyRetention; a key whose effect is kept (a dead letter) is
// never forgotten. Time is moved by rewriting the rows' timestamps.
func TestKeyOutlivesItsPrunedEffect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{CompletedRetention: time.Hour, KeyRetention: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "done"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "dead"},
	)
	done, dead := ids[0], ids[1]
	for _, st := range []struct {
		sql string
		id  int64
	}{
		{`UPDATE pgoutbox.effects SET state = 'completed', completed_at = now() - interval '2 hours' WHERE id = $1`, done},
		{`UPDATE pgoutbox.effects SET state = 'dead_letter', dead_lettered_at = now() - interval '30 days' WHERE id = $1`, dead},
		{`UPDATE pgoutbox.effect_keys SET created_at = now() - interval '3 hours' WHERE effect_id = $1`, done},
		{`UPDATE pgoutbox.effect_keys SET created_at = now() - interval '30 days' WHERE effect_id = $1`, dead},
	} {
		if _, err := b.pool.Exec(b.ctx, st.sql, st.id); err != nil {
			t.Fatalf("%s: %v", st.sql, err)
		}
	}
	if n, err := c.Prune(b.ctx); err != nil || n != 1 {
		t.Fatalf("prune: %d effects (%v), want the completed one", n, err)
	}
	if e, k := b.count(t), b.keyRows(t); e != 1 || k != 2 {
		t.Fatalf("after pruning the completed effect: %d effects and %d key rows, want 1 and 2", e, k)
	}
	// Past CompletedRetention, within KeyRetention: the same key is the same
	// effect, written once.
	if again := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "done"})[0]; again != done || b.count(t) != 1 {
		t.Fatalf("key enqueued again after its effect was pruned: id %d, %d effects; want the pruned id %d and nothing written",
			again, b.count(t), done)
	}

	// Past KeyRetention the key is forgotten; the dead letter's key is kept
	// while the dead letter exists, however old.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effect_keys SET created_at = now() - interval '49 hours' WHERE effect_id = $1`, done); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prune(b.ctx); err != nil {
		t.Fatal(err)
	}
	if k := b.keyRows(t); k != 1 {
		t.Fatalf("after the key retention: %d key rows, want 1 (the dead letter's)", k)
	}
	if again := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "dead"})[0]; again != dead {
		t.Fatalf("the dead letter's key returned %d, want %d", again, dead)
	}
	if fresh := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "done"})[0]; fresh == done || b.count(t) != 2 {
		t.Fatalf("a key past its retention returned %d with %d effects, want a new effect", fresh, b.count(t))
	}
}

// KeyRetention may not be shorter than CompletedRetention; left zero it is
// KeyRetentionDefault, or CompletedRetention when that is longer.
func TestKeyRetentionConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{CompletedRetention: 48 * time.Hour, KeyRetention: 24 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "KeyRetention (24h0m0s) must not be shorter than Config.CompletedRetention (48h0m0s)") {
		t.Fatalf("KeyRetention below CompletedRetention: %v, want a clear refusal", err)
	}
	if _, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{CompletedRetention: 30 * 24 * time.Hour}); err != nil {
		t.Fatalf("a long CompletedRetention with the default KeyRetention: %v", err)
	}
	if _, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{CompletedRetention: -time.Hour}); err == nil {
		t.Fatal("a negative CompletedRetention was accepted")
	}
}

// Defect 6 (issue #11): under REPEATABLE READ, enqueuing a key that a
// concurrent transaction committed after the snapshot fails with a clear
// error that still carries SQLSTATE 40001 (for retry loops), writes
// nothing, and the retried transaction returns the existing effect.
func TestEnqueueRepeatableReadConflictSaysRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rr, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rr.Rollback(context.Background()) }()
	if _, err := rr.Exec(b.ctx, `SELECT count(*) FROM pgoutbox.effects`); err != nil { // the snapshot
		t.Fatal(err)
	}
	e := pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"}
	id := b.enqueue(t, e)[0]
	_, err = pgoutbox.Enqueue(b.ctx, rr, e)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" || !strings.Contains(err.Error(), "retry the transaction") {
		t.Fatalf("REPEATABLE READ enqueue of a key committed after the snapshot: %v, want a 40001 that says to retry", err)
	}
	_ = rr.Rollback(b.ctx)
	var again int64
	err = pgx.BeginTxFunc(b.ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var err error
		again, err = pgoutbox.Enqueue(b.ctx, tx, e)
		return err
	})
	if err != nil || again != id || b.count(t) != 1 {
		t.Fatalf("retry: id %d (%v), %d effects; want the existing %d and one effect", again, err, b.count(t), id)
	}
}
