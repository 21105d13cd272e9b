package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// batchCfg is a client of one batch-storage queue with types.
func batchCfg(queue string, types ...pgoutbox.EffectType) pgoutbox.Config {
	return pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{queue: {Storage: pgoutbox.StorageBatch, Concurrency: 8, PageSize: 100}},
		Types:  types,
	}
}

// counter counts the deliveries of each effect id and keeps, per ordering
// key, the order in which they were delivered.
type counter struct {
	mu    sync.Mutex
	n     map[int64]int
	order map[string][]int64
}

func newCounter() *counter { return &counter{n: map[int64]int{}, order: map[string][]int64{}} }

func (c *counter) add(d *pgoutbox.Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[d.ID]++
	if d.OrderingKey != "" {
		c.order[d.OrderingKey] = append(c.order[d.OrderingKey], d.ID)
	}
}

func (c *counter) count(id int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// TestBatchStorageWritesNothingPerSuccess: every effect of a batch queue,
// enqueued in many transactions, is delivered exactly once when every
// handler succeeds, and none leaves a row in pgoutbox.effects: the stream
// keeps them, and the batches record the settlement.
func TestBatchStorageWritesNothingPerSuccess(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(_ context.Context, d *pgoutbox.Delivery) error { seen.add(d); return nil }}))
	w := watch(t, c)
	var ids []int64
	for tx := range 20 {
		var batch []pgoutbox.Effect
		for i := range 50 {
			batch = append(batch, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: fmt.Sprintf("k-%d-%d", tx, i)})
		}
		ids = append(ids, b.enqueue(t, batch...)...)
	}
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
	for _, id := range ids {
		if n := seen.count(id); n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
	if n := b.count(t); n != 0 {
		t.Errorf("%d rows in pgoutbox.effects, want none: a success writes no row", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE queue = 'bq'`); n != int64(len(ids)) {
		t.Errorf("%d stream rows, want %d", n, len(ids))
	}
	b.waitFor(t, "every batch settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = 'bq' AND done_at IS NULL`) == 0
	})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = 'bq' AND state = 'completed'
		AND attempts = 1 AND completed_at IS NOT NULL`); n != int64(len(ids)) {
		t.Errorf("effect_states shows %d effects completed, want %d", n, len(ids))
	}
	// Every delivery's context was cancelled: none hangs on the Client's
	// work context (each did, about 1 KB an effect, for the process's life).
	if n := c.BatchRunContexts(); n != 0 {
		t.Errorf("%d delivery contexts of %d effects still live after their batches settled", n, len(ids))
	}
}

// TestBatchStorageCommitOrder: a batch holds what committed between two
// ticks, not a range of ids. An effect whose transaction drew its id first
// and commits after a later id was delivered is delivered too (a cursor on
// ids would skip it for ever).
func TestBatchStorageCommitOrder(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(_ context.Context, d *pgoutbox.Delivery) error { seen.add(d); return nil }}))
	w := watch(t, c)
	slow, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(b.ctx) //nolint:errcheck
	first, err := pgoutbox.Enqueue(b.ctx, slow, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "first"})
	if err != nil {
		t.Fatal(err)
	}
	second := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "second"})[0]
	if second <= first {
		t.Fatalf("ids %d, %d: want the open transaction's first", first, second)
	}
	b.waitEvent(t, w, second, "completed")
	if err := slow.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitEvent(t, w, first, "completed")
	if seen.count(first) != 1 || seen.count(second) != 1 {
		t.Fatalf("deliveries: first %d, second %d; want one each", seen.count(first), seen.count(second))
	}
}

// TestBatchStorageExceptions: the effects that do not succeed from their
// batch move to pgoutbox.effects with the state the row storage would
// give them, and finish there: a retry is retried, a permanent failure is
// a dead letter with its attempt recorded, a type that is not replay-safe
// is delivered under a durable lease with its start recorded first, and an
// internal job runs in its completion transaction.
func TestBatchStorageExceptions(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	attempts := map[string][]int{}
	note := func(d *pgoutbox.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		attempts[d.Key] = append(attempts[d.Key], d.Attempt)
	}
	c := b.startClient(t, batchCfg("bq",
		pgoutbox.EffectType{Name: "flaky", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			note(d)
			if d.Attempt == 1 {
				return pgoutbox.Retry(errors.New("try again"))
			}
			return nil
		}},
		pgoutbox.EffectType{Name: "broken", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			note(d)
			return pgoutbox.Permanent(errors.New("never"))
		}},
		pgoutbox.EffectType{Name: "once", Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			note(d)
			return nil
		}},
		pgoutbox.EffectType{Name: "job", TxHandler: func(ctx context.Context, tx pgx.Tx, d *pgoutbox.Delivery) error {
			note(d)
			_, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS job_done (id bigint)`)
			if err == nil {
				_, err = tx.Exec(ctx, `INSERT INTO job_done VALUES ($1)`, d.ID)
			}
			return err
		}},
	))
	w := watch(t, c)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "bq", Type: "flaky", Key: "flaky"},
		pgoutbox.Effect{Queue: "bq", Type: "broken", Key: "broken"},
		pgoutbox.Effect{Queue: "bq", Type: "once", Key: "once"},
		pgoutbox.Effect{Queue: "bq", Type: "job", Key: "job"},
	)
	b.waitEvent(t, w, ids[0], "completed")
	b.waitEvent(t, w, ids[1], "dead_letter")
	b.waitEvent(t, w, ids[2], "completed")
	b.waitEvent(t, w, ids[3], "completed")

	if got := b.row(t, ids[0]); got.State != "completed" || got.Attempts != 2 {
		t.Errorf("retried effect: %s after %d attempts, want completed after 2", got.State, got.Attempts)
	}
	if got := b.row(t, ids[1]); got.State != "dead_letter" || got.Attempts != 1 || got.LastError == nil {
		t.Errorf("permanent failure: %s after %d attempts (error %v), want dead_letter after 1 with its error",
			got.State, got.Attempts, got.LastError)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_attempts WHERE effect_id = $1 AND outcome = 'dead_letter'`, ids[1]); n != 1 {
		t.Errorf("dead letter's attempt records: %d, want 1", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND delivery_started_at IS NOT NULL`, ids[2]); n != 1 {
		t.Errorf("the not-replay-safe effect has no recorded start: it was not delivered under a durable lease")
	}
	if n := b.scalar(t, `SELECT count(*) FROM job_done WHERE id = $1`, ids[3]); n != 1 {
		t.Errorf("internal job's write: %d rows, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for key, want := range map[string][]int{"flaky": {1, 2}, "broken": {1}, "once": {1}, "job": {1}} {
		if !slices.Equal(attempts[key], want) {
			t.Errorf("%s: attempts %v, want %v", key, attempts[key], want)
		}
	}
}

// TestBatchStorageOrdering: the effects of one ordering key are delivered
// in enqueue order even when one of them fails in its batch: the ones
// behind it move to pgoutbox.effects after it and wait there, and a later
// batch's effect of the key waits behind them too.
func TestBatchStorageOrdering(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	var failOnce sync.Once
	var failing int64
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ord", ReplaySafe: true,
		Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			var fail bool
			if d.ID == failing {
				failOnce.Do(func() { fail = true })
			}
			if fail {
				return pgoutbox.Retry(errors.New("not yet"))
			}
			seen.add(d)
			return nil
		}}))
	w := watch(t, c)
	var effects []pgoutbox.Effect
	for i := range 30 {
		effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "ord", Key: fmt.Sprintf("e%d", i),
			OrderingKey: fmt.Sprintf("key-%d", i%3)})
	}
	// Enqueued in one transaction, so that they are one batch; the failing
	// one is chosen before the client can see them.
	var ids []int64
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		if ids, err = pgoutbox.EnqueueBatch(b.ctx, tx, effects); err == nil {
			failing = ids[4] // key-1, its second effect
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
	later := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ord", Key: "later", OrderingKey: "key-1"})[0]
	b.waitEvent(t, w, later, "completed")
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for k := range 3 {
		key := fmt.Sprintf("key-%d", k)
		var want []int64
		for i, id := range ids {
			if i%3 == k {
				want = append(want, id)
			}
		}
		if k == 1 {
			want = append(want, later)
		}
		if got := seen.order[key]; !slices.Equal(got, want) {
			t.Errorf("%s delivered in order %v, want %v", key, got, want)
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE ordering_key = 'key-1'`); n != 9 {
		t.Errorf("%d effects of key-1 moved to pgoutbox.effects, want 9: the failed one and the 8 behind it", n)
	}
}

// TestBatchStorageFencedSettle: a consumer whose batch lease was taken
// over writes nothing when it settles: not its position, not its
// exceptions.
func TestBatchStorageFencedSettle(t *testing.T) {
	b := setup(t)
	if err := store.SetStorage(b.ctx, b.pool, []string{"bq"}, []string{store.StorageBatch}, nil); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "t", Key: "a"}, pgoutbox.Effect{Queue: "bq", Type: "t", Key: "b"})
	if ticked, err := store.Tick(b.ctx, b.pool, "bq"); err != nil || !ticked {
		t.Fatalf("tick: %v, %v", ticked, err)
	}
	stale, ok, err := store.ClaimBatch(b.ctx, b.pool, "bq", "stale", time.Millisecond)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	page, err := store.Page(b.ctx, b.pool, stale, stale.DoneThrough, 10)
	if err != nil || len(page) != 2 || page[0].ID != ids[0] || page[1].ID != ids[1] {
		t.Fatalf("page: %v, %v", page, err)
	}
	b.waitFor(t, "the stale lease to expire", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE lease_expires_at < now()`) == 1
	})
	fresh, ok, err := store.ClaimBatch(b.ctx, b.pool, "bq", "fresh", time.Minute)
	if err != nil || !ok || fresh.Token == stale.Token || fresh.ID != stale.ID {
		t.Fatalf("re-lease: %v, %v (tokens %v, %v)", ok, err, fresh.Token, stale.Token)
	}
	moves := []store.Move{{Effect: page[0], State: "dead_letter", Attempts: 1, Error: "stale"}}
	found, err := store.Settle(b.ctx, b.pool, stale, "stale", store.PageSettle{Through: stale.MaxID, Last: true, Moves: moves}, nil)
	if err != nil || found {
		t.Fatalf("stale settle: found %v, %v; want not found", found, err)
	}
	if n := b.count(t); n != 0 {
		t.Errorf("the stale settle moved %d effects", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE done_at IS NOT NULL OR done_through >= $1`, ids[0]); n != 0 {
		t.Errorf("the stale settle advanced the batch")
	}
	found, err = store.Settle(b.ctx, b.pool, fresh, "fresh", store.PageSettle{Through: fresh.MaxID, Last: true, Moves: moves}, nil)
	if err != nil || !found {
		t.Fatalf("fresh settle: found %v, %v", found, err)
	}
	if got := b.row(t, ids[0]); got.State != "dead_letter" {
		t.Errorf("moved effect is %s, want dead_letter", got.State)
	}
}

// TestBatchStorageRotation: a generation is emptied by TRUNCATE once it is
// closed and a batch ticked after the close is settled; idempotency keys
// outlive it, as they outlive a pruned effect.
func TestBatchStorageRotation(t *testing.T) {
	b := setup(t)
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}))
	w := watch(t, c)
	first := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "first"})[0]
	b.waitEvent(t, w, first, "completed")
	gen := b.scalar(t, `SELECT gen FROM pgoutbox.stream WHERE id = $1`, first)
	// Closes the generation (nothing to truncate yet).
	if n, err := store.StreamMaintain(b.ctx, b.pool, 0, 0); err != nil || n != 0 {
		t.Fatalf("maintain: %d, %v", n, err)
	}
	if s := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_generations WHERE gen = $1 AND state = 'closed'`, gen); s != 1 {
		t.Fatal("the generation was not closed")
	}
	// Not truncated before a batch ticked after the close is settled.
	second := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "second"})[0]
	if g := b.scalar(t, `SELECT gen FROM pgoutbox.stream WHERE id = $1`, second); g == gen {
		t.Fatalf("a new effect went to the closed generation %d", g)
	}
	b.waitEvent(t, w, second, "completed")
	b.waitFor(t, "the second batch settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE done_at IS NULL`) == 0
	})
	if n, err := store.StreamMaintain(b.ctx, b.pool, time.Hour, 0); err != nil || n != 1 {
		t.Fatalf("maintain: %d truncated, %v; want 1", n, err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE gen = $1`, gen); n != 0 {
		t.Errorf("%d rows left in the truncated generation", n)
	}
	// The key outlives its row: enqueuing it again returns the same id and
	// writes nothing.
	again := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "first"})[0]
	if again != first || b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE id = $1`, first) != 0 {
		t.Errorf("re-enqueued key: id %d (want %d)", again, first)
	}
}

// TestBatchStorageSQLEnqueue: an effect enqueued through the SQL API into
// a batch queue goes to the stream, keeps its idempotency key and is
// delivered.
func TestBatchStorageSQLEnqueue(t *testing.T) {
	b := setup(t)
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}))
	w := watch(t, c)
	id := b.scalar(t, `SELECT pgoutbox.enqueue('bq', 'ok', 'sql-key', '{"a":1}')`)
	again := b.scalar(t, `SELECT pgoutbox.enqueue('bq', 'ok', 'sql-key', '{"a":1}')`)
	if again != id {
		t.Errorf("same key: ids %d, %d", id, again)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE id = $1`, id); n != 1 {
		t.Errorf("%d stream rows for the SQL enqueue, want 1", n)
	}
	b.waitEvent(t, w, id, "completed")
	if n := b.count(t); n != 0 {
		t.Errorf("%d rows in pgoutbox.effects", n)
	}
}

// TestBatchStorageTicksBySnapshot: consecutive batches partition the
// committed effects by commit, whatever their ids: an effect whose
// transaction drew the lowest id and committed last is in the later batch,
// and that batch, whose ids span the earlier one's, holds none of it.
func TestBatchStorageTicksBySnapshot(t *testing.T) {
	b := setup(t)
	if err := store.SetStorage(b.ctx, b.pool, []string{"sq"}, []string{store.StorageBatch}, nil); err != nil {
		t.Fatal(err)
	}
	slow, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(b.ctx) //nolint:errcheck
	a, err := pgoutbox.Enqueue(b.ctx, slow, pgoutbox.Effect{Queue: "sq", Type: "t", Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	bID := b.enqueue(t, pgoutbox.Effect{Queue: "sq", Type: "t", Key: "b"})[0]
	page := func() []int64 {
		t.Helper()
		if ticked, err := store.Tick(b.ctx, b.pool, "sq"); err != nil || !ticked {
			t.Fatalf("tick: %v, %v", ticked, err)
		}
		bt, ok, err := store.ClaimBatch(b.ctx, b.pool, "sq", "me", time.Minute)
		if err != nil || !ok {
			t.Fatalf("claim: %v, %v", ok, err)
		}
		rows, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 100)
		if err != nil {
			t.Fatal(err)
		}
		if found, err := store.Settle(b.ctx, b.pool, bt, "me", store.PageSettle{Through: bt.MaxID, Last: true}, nil); err != nil || !found {
			t.Fatalf("settle: %v, %v", found, err)
		}
		var ids []int64
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		return ids
	}
	if got := page(); !slices.Equal(got, []int64{bID}) {
		t.Fatalf("first batch %v, want [%d]: the open transaction's effect is not committed", got, bID)
	}
	if st := b.row(t, bID).State; st != "completed" {
		t.Errorf("effect_states: the settled effect is %s", st)
	}
	if ticked, err := store.Tick(b.ctx, b.pool, "sq"); err != nil || ticked {
		t.Fatalf("tick with nothing new committed: ticked %v, %v", ticked, err)
	}
	if err := slow.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	c := b.enqueue(t, pgoutbox.Effect{Queue: "sq", Type: "t", Key: "c"})[0]
	if st := b.row(t, a).State; st != "available" {
		t.Errorf("effect_states: the late commit, not yet in a batch, is %s", st)
	}
	if got := page(); !slices.Equal(got, []int64{a, c}) {
		t.Fatalf("second batch %v, want [%d %d]: the late commit and the new one, not %d again", got, a, c, bID)
	}
}

// TestBatchStorageExpiredLease: a batch whose consumer died holding it is
// taken over when its lease expires; its effects move to the row storage.
// Those that may have run from the batch (not a key's later effects) have
// that attempt counted, so that an effect that kills its consumer is
// dead-lettered after max_attempts; none is dead-lettered by the take-over
// itself, which does not know whether it was called: an effect with
// max_attempts 1 is still delivered.
func TestBatchStorageExpiredLease(t *testing.T) {
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "bq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "bq", "lanes"); err == nil {
		t.Error("SetStorage took an unknown storage")
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "a"},
		pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "b", MaxAttempts: 1},
		pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "c", OrderingKey: "k"},
		pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "d", OrderingKey: "k"})
	if ticked, err := store.Tick(b.ctx, b.pool, "bq"); err != nil || !ticked {
		t.Fatalf("tick: %v, %v", ticked, err)
	}
	if _, ok, err := store.ClaimBatch(b.ctx, b.pool, "bq", "dead", time.Millisecond); err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	b.waitFor(t, "the dead consumer's lease to expire", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE lease_expires_at < now()`) == 1
	})
	seen := newCounter()
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(_ context.Context, d *pgoutbox.Delivery) error { seen.add(d); return nil }}))
	w := watch(t, c)
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
	for i, want := range []int{2, 2, 2, 1} {
		if got := b.row(t, ids[i]); got.State != "completed" || got.Attempts != want || seen.count(ids[i]) != 1 {
			t.Errorf("taken-over effect %d: %s after %d attempts, delivered %d times here; want completed after %d, once",
				i, got.State, got.Attempts, seen.count(ids[i]), want)
		}
	}
}

// TestBatchStorageSlowHandlerIsPromoted: a handler still running when its
// page's hold ends does not hold its queue up: it is promoted to a durable
// lease in pgoutbox.effects, the page settles, later batches are
// delivered, the effect behind it of its ordering key waits for it, and it
// completes under its lease.
func TestBatchStorageSlowHandlerIsPromoted(t *testing.T) {
	b := setup(t)
	release := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	seen := newCounter()
	cfg := pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch, Concurrency: 4,
			PageHold: 20 * time.Millisecond}},
		Types: []pgoutbox.EffectType{
			{Name: "slow", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				once.Do(func() { close(started) })
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				seen.add(d)
				return nil
			}},
			{Name: "fast", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				seen.add(d)
				return nil
			}},
		},
	}
	c := b.startClient(t, cfg)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	w := watch(t, c)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "bq", Type: "slow", Key: "slow", OrderingKey: "k"},
		pgoutbox.Effect{Queue: "bq", Type: "fast", Key: "behind", OrderingKey: "k"},
		pgoutbox.Effect{Queue: "bq", Type: "fast", Key: "free"})
	<-started
	b.waitEvent(t, w, ids[2], "completed")
	later := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "fast", Key: "later"})[0]
	b.waitEvent(t, w, later, "completed")
	if got := b.row(t, ids[0]); got.State != "leased" || got.Token == nil {
		t.Errorf("the slow delivery is %s (token %v), want leased under a durable lease", got.State, got.Token)
	}
	if got := b.row(t, ids[1]); got.State != "available" || seen.count(ids[1]) != 0 {
		t.Errorf("the effect behind the slow one is %s, delivered %d times; want available, waiting", got.State,
			seen.count(ids[1]))
	}
	close(release)
	b.waitEvent(t, w, ids[0], "completed")
	b.waitEvent(t, w, ids[1], "completed")
	if got := b.row(t, ids[0]); got.State != "completed" || got.Attempts != 1 {
		t.Errorf("the slow delivery ended %s after %d attempts, want completed after 1", got.State, got.Attempts)
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if got := seen.order["k"]; !slices.Equal(got, ids[:2]) {
		t.Errorf("key k delivered in order %v, want %v", got, ids[:2])
	}
}

// TestBatchStorageStatus: `status` (and the console and /metrics, which
// read the same aggregate) counts a batch queue's stream effects still to
// deliver, and forgets them once their batch is settled.
func TestBatchStorageStatus(t *testing.T) {
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "bq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	queue := func() ops.Counts {
		t.Helper()
		snap, err := ops.Status(b.ctx, b.pool, ops.StatusOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range snap.Queues {
			if q.Queue == "bq" {
				return q
			}
		}
		return ops.Counts{}
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "a"}, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "b"})
	if q := queue(); q.Available+q.Leased != 2 || q.CompletedRecent != 0 {
		t.Fatalf("status counts %d effects to deliver and %d completed, want 2 and 0", q.Available+q.Leased,
			q.CompletedRecent)
	}
	c := b.startClient(t, batchCfg("bq", pgoutbox.EffectType{Name: "ok", ReplaySafe: true,
		Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}))
	w := watch(t, c)
	b.waitEvent(t, w, ids[0], "completed")
	b.waitEvent(t, w, ids[1], "completed")
	b.waitFor(t, "the batch settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE done_at IS NULL`) == 0
	})
	q := queue()
	if n := q.Available + q.Leased; n != 0 {
		t.Errorf("status counts %d effects to deliver after the batch settled, want 0", n)
	}
	if q.CompletedRecent != 2 || q.LagP50Seconds == nil || q.LagP99Seconds == nil {
		t.Errorf("status counts %d completed (lag p50 %v, p99 %v) after the batch settled, want 2 with lags",
			q.CompletedRecent, q.LagP50Seconds, q.LagP99Seconds)
	}
	more := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "c"})[0]
	b.waitEvent(t, w, more, "completed")
	b.waitFor(t, "the second batch settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE done_at IS NULL`) == 0
	})
	if q := queue(); q.Available+q.Leased != 0 || q.CompletedRecent != 3 {
		t.Errorf("status counts %d effects to deliver and %d completed after the second batch, want 0 and 3",
			q.Available+q.Leased, q.CompletedRecent)
	}
}

// TestBatchStorageEffectDetail: the console's effect page finds an effect
// that is still in the stream, with its state.
func TestBatchStorageEffectDetail(t *testing.T) {
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "bq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "ok", Key: "a", Payload: map[string]int{"n": 1}})[0]
	d, found, err := store.GetEffectDetail(b.ctx, b.pool, id)
	if err != nil || !found {
		t.Fatalf("detail of a stream effect: found %v, %v", found, err)
	}
	if d.Queue != "bq" || d.Type != "ok" || d.State != "available" || string(d.Payload) != `{"n": 1}` {
		t.Errorf("detail: queue %q type %q state %q payload %s", d.Queue, d.Type, d.State, d.Payload)
	}
	if _, found, err := store.GetEffectDetail(b.ctx, b.pool, id+1000); err != nil || found {
		t.Errorf("detail of no effect: found %v, %v", found, err)
	}
}

// TestBatchStorageRunsUpToConcurrency: a page's effects run on as many
// workers as the queue's Concurrency allows, and never more: with
// handlers that block, a page of 10 effects has 3 running at once at a
// Concurrency of 3, each released handler lets the next effect start, and
// every effect is delivered once.
func TestBatchStorageRunsUpToConcurrency(t *testing.T) {
	b := setup(t)
	const conc, n = 3, 10
	p := newConcurrencyProbe(conc)
	c := b.startClient(t, pgoutbox.Config{
		LeaseDuration: 3 * time.Hour,
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch, Concurrency: conc,
			PageSize: 100, PageHold: time.Hour, DeliveryTimeout: time.Hour}},
		Types: []pgoutbox.EffectType{{Name: "block", ReplaySafe: true, Handler: p.block}},
	})
	w := watch(t, c)
	var effects []pgoutbox.Effect
	for i := range n {
		effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "block", Key: fmt.Sprint(i)})
	}
	ids := b.enqueue(t, effects...)
	p.releaseAll(t, b, n)
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
		if k := p.seen.count(id); k != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, k)
		}
	}
	if m := p.most.Load(); m != conc {
		t.Errorf("at most %d handlers ran at once, want %d (the queue's Concurrency)", m, conc)
	}
	if k := b.count(t); k != 0 {
		t.Errorf("%d rows in pgoutbox.effects, want none: every effect ran from its batch", k)
	}
}

// TestBatchStorageConcurrencyCountsRowDeliveries: a batch queue's
// Concurrency bounds its page runs and its row claim loop's deliveries
// together. Three effects of a type that is not replay-safe go through the
// row storage and block every slot; a page of replay-safe effects then
// waits for the slots they free, one by one, instead of starting beside
// them.
func TestBatchStorageConcurrencyCountsRowDeliveries(t *testing.T) {
	b := setup(t)
	const conc, rowsN, pageN = 3, 3, 5
	p := newConcurrencyProbe(conc)
	c := b.startClient(t, pgoutbox.Config{
		LeaseDuration: 3 * time.Hour,
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch, Concurrency: conc,
			PageSize: 100, PageHold: time.Hour, DeliveryTimeout: time.Hour}},
		Types: []pgoutbox.EffectType{
			{Name: "once", Handler: p.block},
			{Name: "block", ReplaySafe: true, Handler: p.block},
		},
	})
	w := watch(t, c)
	var effects []pgoutbox.Effect
	for i := range rowsN {
		effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "once", Key: fmt.Sprint("r", i)})
	}
	ids := b.enqueue(t, effects...)
	b.waitFor(t, "the row storage's deliveries in every slot", func() bool {
		return p.running.Load() == conc && p.started.Load() == conc
	})
	effects = effects[:0]
	for i := range pageN {
		effects = append(effects, pgoutbox.Effect{Queue: "bq", Type: "block", Key: fmt.Sprint("p", i)})
	}
	pageIDs := b.enqueue(t, effects...)
	ids = append(ids, pageIDs...)
	p.releaseAll(t, b, rowsN+pageN)
	for _, id := range ids {
		b.waitEvent(t, w, id, "completed")
	}
	var fromRows int
	if err := b.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pgoutbox.effects WHERE id = ANY($1)`, pageIDs).Scan(&fromRows); err != nil {
		t.Fatal(err)
	}
	if fromRows != 0 {
		t.Errorf("%d of the page's effects went to pgoutbox.effects, want none: each waited for a slot and ran from its batch", fromRows)
	}
}

// TestBatchStorageLostLeaseCancelsItsRuns: when another consumer takes a
// batch over while a handler runs from it, the handler's context is
// cancelled with ErrLeaseLost at the next extension, as a lost lease
// cancels a delivery in the row storage.
func TestBatchStorageLostLeaseCancelsItsRuns(t *testing.T) {
	b := setup(t)
	started, causes := make(chan struct{}, 1), make(chan error, 1)
	b.startClient(t, pgoutbox.Config{
		// The batch's lease is extended every 5 s: the loss is seen at the
		// first extension after the take-over, long before the handler's
		// own deadline (its timeout must be below the lease).
		LeaseDuration: 15 * time.Second,
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch, Concurrency: 2,
			PageSize: 100, PageHold: time.Hour, DeliveryTimeout: 14 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "block", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			select {
			case started <- struct{}{}:
			default:
			}
			<-ctx.Done()
			select {
			case causes <- context.Cause(ctx):
			default:
			}
			return ctx.Err()
		}}},
	})
	b.enqueue(t, pgoutbox.Effect{Queue: "bq", Type: "block", Key: "k"})
	select {
	case <-started:
	case <-b.ctx.Done():
		t.Fatal("the handler never started")
	}
	// Another consumer takes the batch over.
	tag, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.stream_batches
		SET lease_token = gen_random_uuid(), lease_owner = 'thief', lease_expires_at = now() + interval '1 hour'
		WHERE queue = 'bq' AND done_at IS NULL AND lease_token IS NOT NULL`)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("taking the batch over: %v, %d rows, want 1", err, tag.RowsAffected())
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, pgoutbox.ErrLeaseLost) {
			t.Fatalf("the handler's context was cancelled with %v, want ErrLeaseLost", cause)
		}
	case <-b.ctx.Done():
		t.Fatal("the handler ran on after its batch's lease was taken over: not cancelled")
	}
}

// concurrencyProbe is a handler that blocks until released, counting the
// handlers running at once and the most that ever did.
type concurrencyProbe struct {
	conc                   int
	running, most, started atomic.Int64
	release                chan struct{}
	seen                   *counter
}

func newConcurrencyProbe(conc int) *concurrencyProbe {
	return &concurrencyProbe{conc: conc, release: make(chan struct{}), seen: newCounter()}
}

func (p *concurrencyProbe) block(ctx context.Context, d *pgoutbox.Delivery) error {
	now := p.running.Add(1)
	defer p.running.Add(-1)
	for m := p.most.Load(); now > m && !p.most.CompareAndSwap(m, now); m = p.most.Load() {
	}
	p.started.Add(1)
	select {
	case <-p.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.seen.add(d)
	return nil
}

// releaseAll releases n blocked handlers one by one, each once the queue's
// Concurrency of them (or all that are left) run, and fails the test when
// more ever ran at once.
func (p *concurrencyProbe) releaseAll(t *testing.T, b *bundle, n int) {
	t.Helper()
	conc := p.conc
	for i := range n {
		b.waitFor(t, fmt.Sprintf("%d handlers running (%d started)", min(conc, n-i), min(n, i+conc)), func() bool {
			return p.most.Load() > int64(conc) ||
				p.running.Load() == int64(min(conc, n-i)) && p.started.Load() == int64(min(n, i+conc))
		})
		if m := p.most.Load(); m > int64(conc) {
			close(p.release)
			t.Fatalf("%d handlers ran at once, above the queue's Concurrency of %d", m, conc)
		}
		p.release <- struct{}{}
	}
}

// TestBatchStorageSwitchedBackToRows: a queue switched from batch storage
// back to rows has its stream's effects delivered by a Client that starts
// with Storage rows (the next deployment's), from their batches, once each;
// they were never delivered before (no Client ran a batch loop for a queue
// of row storage). What is enqueued after the switch goes to rows. Once the
// stream holds none of the queue's effects, its batch loop ends. An
// ordered effect enqueued after the switch is delivered after its key's
// effects in the stream (migration 00034).
func TestBatchStorageSwitchedBackToRows(t *testing.T) {
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "back", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "back", Type: "ok", Key: "s1"},
		pgoutbox.Effect{Queue: "back", Type: "ok", Key: "s2", OrderingKey: "o"},
		pgoutbox.Effect{Queue: "back", Type: "ok", Key: "s3", OrderingKey: "o"})
	seen := newCounter()
	c := b.startClient(t, pgoutbox.Config{
		Queues: map[string]pgoutbox.QueueConfig{"back": {Storage: pgoutbox.StorageRows, Concurrency: 4}},
		Types: []pgoutbox.EffectType{{Name: "ok", ReplaySafe: true,
			Handler: func(_ context.Context, d *pgoutbox.Delivery) error { seen.add(d); return nil }}},
	})
	ids = append(ids, b.enqueue(t, pgoutbox.Effect{Queue: "back", Type: "ok", Key: "r1"},
		pgoutbox.Effect{Queue: "back", Type: "ok", Key: "r2", OrderingKey: "o"})...)
	b.waitFor(t, "every effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = 'back' AND state = 'completed'`) == 5
	})
	for _, id := range ids {
		if n := seen.count(id); n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
	if want := []int64{ids[1], ids[2], ids[4]}; !slices.Equal(seen.order["o"], want) {
		t.Errorf("ordering key o delivered %v, want %v", seen.order["o"], want)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE queue = 'back'`); n != 3 {
		t.Errorf("%d stream rows, want the 3 enqueued before the switch", n)
	}
	// Rows: the ones enqueued after the switch, and o's second effect,
	// moved behind its key's head as every batch page moves a key's later
	// effects.
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'back' AND id = ANY($1)`,
		ids[2:]); n != 3 {
		t.Errorf("%d of effects %v in pgoutbox.effects, want all", n, ids[2:])
	}
	// o's head too, unless the page that met it found r2 already in rows.
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'back' AND id = $1`, ids[0]); n != 0 {
		t.Errorf("effect %d in pgoutbox.effects, want it delivered from the batch", ids[0])
	}
	if !c.BatchLoopRuns("back") {
		t.Fatal("the batch loop stopped while the stream held the queue's effects")
	}
	// As a rotation would: the stream holds none of the queue's effects.
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM pgoutbox.stream WHERE queue = 'back'`); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the batch loop to end", func() bool { return !c.BatchLoopRuns("back") })
}

// TestBatchStorageSwitchedWhileRunning: a queue switched to batch storage
// by SetStorage while a Client of it runs (having read rows at its start)
// has its new effects delivered from the stream: the Client reads the
// queues' storage again at each sweep and starts the batch loop. Nothing
// is left undelivered in the stream for want of a restart.
func TestBatchStorageSwitchedWhileRunning(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	b.startClient(t, pgoutbox.Config{
		Queues:        map[string]pgoutbox.QueueConfig{"live": {Storage: pgoutbox.StorageRows, Concurrency: 4}},
		SweepInterval: 20 * time.Millisecond,
		Types: []pgoutbox.EffectType{{Name: "ok", ReplaySafe: true,
			Handler: func(_ context.Context, d *pgoutbox.Delivery) error { seen.add(d); return nil }}},
	})
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "live", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "live", Type: "ok", Key: "a"}, pgoutbox.Effect{Queue: "live", Type: "ok", Key: "b"})
	b.waitFor(t, "both effects completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE id = ANY($1) AND state = 'completed'`, ids) == 2
	})
	for _, id := range ids {
		if n := seen.count(id); n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'live'`); n != 0 {
		t.Errorf("%d rows in pgoutbox.effects, want none: delivered from the batch", n)
	}
}

// TestBatchStoragePayloadAsWritten: a batch queue's stream keeps the
// payload as the producer wrote it (json, migration 00036), so a page
// hands the handler those bytes; the retry, delivered from
// pgoutbox.effects, hands it jsonb's text of the same value (its size
// bound: TestEnqueueStoredSizeErrorSaysWhy).
func TestBatchStoragePayloadAsWritten(t *testing.T) {
	b := setup(t)
	const given = `{"z": [1, 2.50, "\u00e9"],  "a":{"b":null}}`
	var mu sync.Mutex
	var got []string
	c := b.startClient(t, batchCfg("pq",
		pgoutbox.EffectType{Name: "t", ReplaySafe: true, Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, string(d.Payload))
			if d.Attempt == 1 {
				return pgoutbox.Retry(errors.New("again"))
			}
			return nil
		}},
	))
	w := watch(t, c)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "pq", Type: "t", Key: "k", Payload: json.RawMessage(given)})
	b.waitEvent(t, w, ids[0], "completed")
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != given {
		t.Fatalf("payloads delivered %q, want first the bytes given, %q, then the retry's", got, given)
	}
	var first, retry any
	if err := json.Unmarshal([]byte(got[0]), &first); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(got[1]), &retry); err != nil || !reflect.DeepEqual(first, retry) {
		t.Fatalf("the retry's payload %q (%v): want the same JSON value as %q", got[1], err, got[0])
	}
}
