package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
)

// keyRows is how many key rows exist (pgoutbox.effect_keys, migration 00006).
func (b *bundle) keyRows(t *testing.T) int64 {
	return b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_keys`)
}

// The key table holds exactly one row per effect, whatever wrote the
// effects (the library or plain SQL), and keeps it when the effect is
// deleted.
func TestKeyRowsFollowEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "b"},
	)

	// Plain SQL gets its key row from the trigger, and the library then sees it.
	var plain int64
	if err := b.pool.QueryRow(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		VALUES ('q', 't', 'c') RETURNING id`).Scan(&plain); err != nil {
		t.Fatal(err)
	}
	if got := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "c"})[0]; got != plain {
		t.Fatalf("enqueue of a key written by plain SQL returned %d, want %d", got, plain)
	}
	if e, k := b.count(t), b.keyRows(t); e != 3 || k != 3 {
		t.Fatalf("%d effects and %d key rows, want 3 and 3", e, k)
	}

	// The library's statement marks itself for the insert trigger; the
	// mark ends with the statement, so plain SQL later in the same
	// transaction still gets its key row.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "d"}); err != nil {
			return err
		}
		_, err := tx.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('q', 't', 'e')`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if e, k := b.count(t), b.keyRows(t); e != 5 || k != 5 {
		t.Fatalf("after enqueue and plain SQL in one transaction: %d effects and %d key rows, want 5 and 5", e, k)
	}

	// Plain SQL repeating a key fails on the key table and writes nothing.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('q', 't', 'a')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.ConstraintName != "effect_keys_pkey" {
		t.Fatalf("plain duplicate: want unique_violation on effect_keys_pkey, got %v", err)
	}
	if e, k := b.count(t), b.keyRows(t); e != 5 || k != 5 {
		t.Fatalf("after a refused duplicate: %d effects and %d key rows, want 5 and 5", e, k)
	}

	// The key and queue of an effect cannot change; nothing is written.
	before := b.rowJSON(t, ids[0])
	_, err = b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET idempotency_key = 'z' WHERE id = $1`, ids[0])
	if err == nil || !strings.Contains(err.Error(), "cannot be changed") {
		t.Fatalf("key update: want a refusal, got %v", err)
	}
	if after := b.rowJSON(t, ids[0]); after != before {
		t.Fatalf("refused key update changed the row:\n%s\n%s", before, after)
	}

	// Deleting an effect keeps its key (migration 00007): the next enqueue
	// returns the deleted effect's id and writes nothing, until the key
	// pruner forgets the key after KeyRetention.
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM pgoutbox.effects WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if e, k := b.count(t), b.keyRows(t); e != 4 || k != 5 {
		t.Fatalf("after delete: %d effects and %d key rows, want 4 and 5", e, k)
	}
	if again := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"})[0]; again != ids[0] || b.count(t) != 4 {
		t.Fatalf("re-enqueue after delete returned %d with %d effects, want the deleted id %d and nothing written", again, b.count(t), ids[0])
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_keys k JOIN pgoutbox.effects e ON e.id = k.effect_id
		WHERE e.queue = k.queue AND e.idempotency_key = k.idempotency_key`); n != 4 {
		t.Fatalf("%d key rows name their effect, want 4", n)
	}

	// TRUNCATE (a reset of the engine) empties the key table too.
	if _, err := b.pool.Exec(b.ctx, `TRUNCATE pgoutbox.effects`); err != nil {
		t.Fatal(err)
	}
	if e, k := b.count(t), b.keyRows(t); e != 0 || k != 0 {
		t.Fatalf("after truncate: %d effects and %d key rows, want 0 and 0", e, k)
	}
	if id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "a"})[0]; id == 0 || b.count(t) != 1 {
		t.Fatalf("enqueue after truncate: id %d, %d effects", id, b.count(t))
	}
}

// A concurrent enqueue of the same key waits for the first transaction: it
// gets the first's id if that commits, and creates the effect if it rolls back,
// whether it sends its batch as arrays or by COPY.
func TestEnqueueSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	paths := map[string]enqueueFunc{"arrays": pgoutbox.EnqueueBatchArrays, "copy": pgoutbox.EnqueueBatchCopy}
	for _, commit := range []bool{true, false} {
		for path, enqueue := range paths {
			t.Run(fmt.Sprintf("first-commits=%v/second=%s", commit, path), func(t *testing.T) {
				sameKeyConcurrently(t, commit, enqueue)
			})
		}
	}
}

func sameKeyConcurrently(t *testing.T, commit bool, enqueue enqueueFunc) {
	t.Parallel()
	b := setup(t)
	e := pgoutbox.Effect{Queue: "q", Type: "t", Key: "same"}
	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(context.Background()) }()
	firstID, err := pgoutbox.Enqueue(b.ctx, first, e)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		id  int64
		err error
	}
	second := make(chan result, 1)
	go func() {
		var id int64
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			ids, err := enqueue(b.ctx, tx, []pgoutbox.Effect{e}, "")
			if err == nil {
				id = ids[0]
			}
			return err
		})
		second <- result{id, err}
	}()
	// The second enqueue is blocked on the first's key row.
	b.waitFor(t, "the second enqueue to wait for the first", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%effect_keys%'`) == 1
	})
	if commit {
		err = first.Commit(b.ctx)
	} else {
		err = first.Rollback(b.ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	if commit != (r.id == firstID) {
		t.Fatalf("first commits=%v: second got %d, first had %d", commit, r.id, firstID)
	}
	if e, k := b.count(t), b.keyRows(t); e != 1 || k != 1 {
		t.Fatalf("%d effects and %d key rows, want 1 and 1", e, k)
	}
}

// The point of the key table: a state change of an effect (claim and
// completion are non-HOT updates, which add an entry to every index of the
// effects table) writes nothing to the key index.
func TestStateChangesDoNotTouchTheKeyIndex(t *testing.T) {
	t.Parallel()
	for _, mode := range leaseModes {
		t.Run(mode.name, func(t *testing.T) {
			b := setup(t)
			const n = 2000
			effects := make([]pgoutbox.Effect, n)
			for i := range effects {
				effects[i] = pgoutbox.Effect{Queue: "q", Type: "noop", Key: pgoutbox.Key("k", fmt.Sprint(i))}
			}
			b.enqueue(t, effects...)
			size := func() int64 { return b.scalar(t, `SELECT pg_relation_size('pgoutbox.effect_keys_pkey')`) }
			before := size()
			if n := b.scalar(t, `SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgoutbox'
				AND tablename = 'effects' AND indexdef LIKE '%idempotency_key%'`); n != 0 {
				t.Fatalf("%d indexes of pgoutbox.effects name idempotency_key, want 0", n)
			}
			b.startClient(t, pgoutbox.Config{
				Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 16, RowLockLease: mode.hold}},
				Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true,
					Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}},
			})
			b.waitFor(t, "every effect to complete", func() bool {
				return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == n
			})
			if after := size(); after != before {
				t.Fatalf("key index grew from %d to %d bytes while effects were only claimed and completed", before, after)
			}
		})
	}
}
