package pgoutbox_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// statusOracleSQL counts a queue's effects to deliver per type and state,
// with the oldest due available age, from every pending stream row
// (pgoutbox.stream_pending, which `status` read before migration 00030) and
// the rows of pgoutbox.effects.
const statusOracleSQL = `
SELECT effect_type, state::text, count(*),
    coalesce(extract(epoch FROM now() - min(available_at) FILTER (WHERE state = 'available' AND available_at <= now())), 0)::float8
FROM (SELECT effect_type, state, available_at FROM pgoutbox.stream_pending WHERE queue = $1
      UNION ALL
      SELECT effect_type, state, available_at FROM pgoutbox.effects WHERE queue = $1 AND state IN ('available', 'leased')) x
GROUP BY 1, 2`

// statusCount is one (type, state) of a queue's effects to deliver.
type statusCount struct {
	Count int64
	Age   float64
}

// checkStatusExact compares store.Stats' counts of queue's effects to
// deliver, per type and state, and their oldest available ages, with
// statusOracleSQL's.
func (b *bundle) checkStatusExact(t *testing.T, step, queue string) {
	t.Helper()
	want := map[string]statusCount{}
	rows, err := b.pool.Query(b.ctx, statusOracleSQL, queue)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var typ, state string
		var c statusCount
		if err := rows.Scan(&typ, &state, &c.Count, &c.Age); err != nil {
			t.Fatal(err)
		}
		want[typ+"/"+state] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	stats, err := store.Stats(b.ctx, b.pool, store.OpsFilter{Queue: queue}, time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]statusCount{}
	for _, s := range stats {
		if s.QueueTotal || (s.State != "available" && s.State != "leased") {
			continue
		}
		got[s.Type+"/"+s.State] = statusCount{Count: s.Count, Age: s.OldestAvailableAge}
	}
	keys := []string{}
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		g, w := got[k], want[k]
		// The two statements read now() a moment apart; the ages differ
		// by an hour or more between the effects' available_at.
		if g.Count != w.Count || math.Abs(g.Age-w.Age) > 60 {
			t.Errorf("%s: status has %s %d (oldest available %.0f s ago), every pending row says %d (%.0f s)",
				step, k, g.Count, g.Age, w.Count, w.Age)
		}
	}
}

// batchAdder records queue's storage as batch and returns a function that
// enqueues n effects of a type, available ago (an interval) before now.
func (b *bundle) batchAdder(t *testing.T, queue string) func(typ string, n int, ago string) {
	t.Helper()
	if err := pgoutbox.SetStorage(b.ctx, b.pool, queue, pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	return func(typ string, n int, ago string) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, available_at)
			SELECT $1, $2, $2 || '-' || $4 || '-' || g, now() - $4::interval FROM generate_series(1, $3) g`,
			queue, typ, n, ago); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBatchStorageStatusExact: `status` counts a batch queue's effects to
// deliver from its batches' per-type counts, not its rows, and keeps the
// numbers every pending row gives, per type and state, with the oldest
// available age: before the tick (the tail not ticked), after it, with a
// tail behind the batch, under a lease, after a partial settle that moved
// an effect to pgoutbox.effects, with the lease released mid-batch, after
// stream_to_rows moved part of a batch, and once everything settled.
func TestBatchStorageStatusExact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const q = "sx"
	add := b.batchAdder(t, q)
	add("a", 3, "3 hours")
	add("a", 2, "2 hours")
	add("b", 3, "5 hours")
	b.checkStatusExact(t, "nothing ticked", q)
	if _, err := store.Tick(b.ctx, b.pool, q); err != nil {
		t.Fatal(err)
	}
	b.checkStatusExact(t, "ticked", q)
	add("a", 2, "10 minutes")
	add("c", 1, "20 minutes")
	b.checkStatusExact(t, "ticked, with a tail", q)

	bt, ok, err := store.ClaimBatch(b.ctx, b.pool, q, "me", time.Hour)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	b.checkStatusExact(t, "leased", q)
	page, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 4)
	if err != nil || len(page) != 4 {
		t.Fatalf("page: %d effects, %v", len(page), err)
	}
	moves := []store.Move{{Effect: page[1], State: "available", Delay: time.Minute, Attempts: 1, Error: "retry"}}
	if found, err := store.Settle(b.ctx, b.pool, bt, "me", store.PageSettle{Through: page[3].ID, Moves: moves,
		Passed: store.PassedTypes(page)}, nil); err != nil || !found {
		t.Fatalf("settle a page: %v, %v", found, err)
	}
	b.checkStatusExact(t, "leased, a page of 4 settled, one moved", q)
	if err := store.ReleaseBatch(b.ctx, b.pool, bt); err != nil {
		t.Fatal(err)
	}
	b.checkStatusExact(t, "released mid-batch", q)

	// stream_to_rows ticks the tail into a second batch and moves two
	// effects of the first into pgoutbox.effects.
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.stream_to_rows($1, 2)`, q); err != nil {
		t.Fatal(err)
	}
	b.checkStatusExact(t, "two moved by stream_to_rows", q)
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = $1 AND done_at IS NULL`, q); n != 2 {
		t.Fatalf("%d open batches, want 2", n)
	}
	for i := range 2 {
		bt, ok, err := store.ClaimBatch(b.ctx, b.pool, q, "me", time.Hour)
		if err != nil || !ok {
			t.Fatalf("claim %d: %v, %v", i, ok, err)
		}
		b.checkStatusExact(t, fmt.Sprintf("batch %d leased again", bt.ID), q)
		page, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 100)
		if err != nil {
			t.Fatal(err)
		}
		if found, err := store.Settle(b.ctx, b.pool, bt, "me", store.PageSettle{Through: bt.MaxID, Last: true,
			Passed: store.PassedTypes(page)}, nil); err != nil || !found {
			t.Fatalf("settle batch %d: %v, %v", bt.ID, found, err)
		}
		b.checkStatusExact(t, fmt.Sprintf("batch %d settled", bt.ID), q)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_pending WHERE queue = $1`, q); n != 0 {
		t.Errorf("%d stream effects still pending, want 0", n)
	}
}

// TestBatchStorageStatusReadsFewRows: `status` of a queue with 20,000
// effects to deliver in one ticked batch, leased and partly settled, reads
// far fewer stream rows than that: its counts come from the batch's row.
func TestBatchStorageStatusReadsFewRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const q, n = "sr", 20000
	if err := pgoutbox.SetStorage(b.ctx, b.pool, q, pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		SELECT $1, 't' || (g % 3), 'k' || g FROM generate_series(1, $2) g`, q, n); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Tick(b.ctx, b.pool, q); err != nil {
		t.Fatal(err)
	}
	// A tail of 5 not ticked.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		SELECT $1, 't0', 'tail' || g FROM generate_series(1, 5) g`, q); err != nil {
		t.Fatal(err)
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	read := func() int64 {
		t.Helper()
		if _, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(b.ctx, `SELECT pg_stat_clear_snapshot() IS NULL`).Scan(new(bool)); err != nil {
			t.Fatal(err)
		}
		var r int64
		if err := conn.QueryRow(b.ctx, `SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0)::bigint
			FROM pg_stat_user_tables WHERE schemaname = 'pgoutbox' AND relname LIKE 'stream\_%'`).Scan(&r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	status := func(step string, want, most int64) {
		t.Helper()
		before := read()
		stats, err := store.Stats(b.ctx, conn.Conn(), store.OpsFilter{Queue: q}, time.Hour, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var pending int64
		for _, s := range stats {
			if s.QueueTotal && (s.State == "available" || s.State == "leased") {
				pending += s.Count
			}
		}
		if pending != want {
			t.Errorf("%s: status counts %d effects to deliver, want %d", step, pending, want)
		}
		if r := read() - before; r > most {
			t.Errorf("%s: status of %d effects to deliver read %d stream rows, want at most %d", step, want, r, most)
		}
	}
	status("ticked", n+5, 100)
	bt, ok, err := store.ClaimBatch(b.ctx, b.pool, q, "me", time.Hour)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	page, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 1000)
	if err != nil || len(page) != 1000 {
		t.Fatalf("page: %d effects, %v", len(page), err)
	}
	if found, err := store.Settle(b.ctx, b.pool, bt, "me", store.PageSettle{Through: page[len(page)-1].ID,
		Passed: store.PassedTypes(page)}, nil); err != nil || !found {
		t.Fatalf("settle: %v, %v", found, err)
	}
	status("leased, a page settled", n+5-1000, 100)
	// Released mid-batch (as SQL and TypeScript batch workers leave a batch
	// between pages): the rest of one chunk of 1,024 ids is read (00035).
	if err := store.ReleaseBatch(b.ctx, b.pool, bt); err != nil {
		t.Fatal(err)
	}
	status("released, a page settled", n+5-1000, 1024+100)
}

// TestBatchStorageStatusChunks: `status` of a batch partially settled and
// not leased takes each type's oldest available effect from the chunks of
// 1,024 ids its tick recorded past the settled position, or from the rows
// of the chunk that holds it (migration 00035), not from what the tick saw
// first: the numbers every pending row gives, whether the oldest left is
// in that chunk or a later one.
func TestBatchStorageStatusChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const q = "sc"
	add := b.batchAdder(t, q)
	add("a", 100, "8 hours") // the first page
	add("a", 1, "6 hours")   // the second page: in the chunk of the first's end
	add("a", 1500, "1 hour") // ...
	add("a", 1, "5 hours")   // chunks later
	add("b", 1, "3 hours")   // another type, later still
	add("a", 500, "30 minutes")
	if _, err := store.Tick(b.ctx, b.pool, q); err != nil {
		t.Fatal(err)
	}
	for i, step := range []string{"a page settled, the oldest left in its chunk", "two pages settled, the oldest left chunks later"} {
		bt, ok, err := store.ClaimBatch(b.ctx, b.pool, q, "me", time.Hour)
		if err != nil || !ok {
			t.Fatalf("claim %d: %v, %v", i, ok, err)
		}
		page, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 100+i)
		if err != nil {
			t.Fatal(err)
		}
		if found, err := store.Settle(b.ctx, b.pool, bt, "me", store.PageSettle{Through: page[len(page)-1].ID,
			Passed: store.PassedTypes(page)}, nil); err != nil || !found {
			t.Fatalf("settle page %d: %v, %v", i, found, err)
		}
		if err := store.ReleaseBatch(b.ctx, b.pool, bt); err != nil {
			t.Fatal(err)
		}
		b.checkStatusExact(t, step, q)
	}
	// A batch ticked before migration 00035 has no chunks: its rows are read.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.stream_batches
		SET chunk_types = NULL, chunk_ends = NULL, chunk_available_at = NULL WHERE queue = $1`, q); err != nil {
		t.Fatal(err)
	}
	b.checkStatusExact(t, "two pages settled, no chunks", q)
}

// TestBatchStorageStatusMidBatch: a Client's page settles record the
// page's effects per type, so `status` of a batch the Client holds, one
// page settled and the next in delivery, has the numbers every pending row
// gives.
func TestBatchStorageStatusMidBatch(t *testing.T) {
	b := setup(t)
	const q = "sm"
	if err := pgoutbox.SetStorage(b.ctx, b.pool, q, pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	var effects []pgoutbox.Effect
	for i := range 5 {
		effects = append(effects, pgoutbox.Effect{Queue: q, Type: []string{"a", "b"}[i%2], Key: fmt.Sprint(i)})
	}
	ids := b.enqueue(t, effects...)
	started, release := make(chan struct{}), make(chan struct{})
	handler := func(_ context.Context, d *pgoutbox.Delivery) error {
		if d.ID == ids[2] {
			close(started)
			<-release
		}
		return nil
	}
	cfg := batchCfg(q, pgoutbox.EffectType{Name: "a", ReplaySafe: true, Handler: handler},
		pgoutbox.EffectType{Name: "b", ReplaySafe: true, Handler: handler})
	qc := cfg.Queues[q]
	qc.PageSize, qc.Concurrency = 2, 1
	cfg.Queues[q] = qc
	c := b.startClient(t, cfg)
	w := watch(t, c)
	<-started
	b.waitFor(t, "the first page settled", func() bool {
		return b.scalar(t, `SELECT coalesce(max(done_through), 0) FROM pgoutbox.stream_batches WHERE queue = $1`, q) >= ids[1]
	})
	b.checkStatusExact(t, "a page settled, the next in delivery", q)
	close(release)
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
	b.waitFor(t, "the batch settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = $1 AND done_at IS NULL`, q) == 0
	})
	b.checkStatusExact(t, "settled", q)
}
