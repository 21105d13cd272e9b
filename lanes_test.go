package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// lanesCfg is batchCfg with the queue's Lanes, and a PageHold long enough
// that a handler the test blocks is not promoted to a durable lease.
func lanesCfg(queue string, lanes int, types ...pgoutbox.EffectType) pgoutbox.Config {
	cfg := batchCfg(queue, types...)
	q := cfg.Queues[queue]
	q.Lanes, q.DeliveryTimeout, q.PageHold = lanes, 2*time.Minute, time.Minute
	cfg.Queues[queue] = q
	cfg.LeaseDuration = 5 * time.Minute
	return cfg
}

// keysInLanes returns one ordering key per lane of a queue with lanes
// lanes, lane 0 first (migration 00031: lane slot * lanes / 256).
func keysInLanes(t *testing.T, b *bundle, lanes int) []string {
	t.Helper()
	keys := make([]string, lanes)
	for i, found := 0, 0; found < lanes; i++ {
		k := fmt.Sprintf("key-%d", i)
		if l := b.scalar(t, `SELECT pgoutbox.stream_slot($1, 0) * $2::int / 256`, k, lanes); keys[l] == "" {
			keys[l] = k
			found++
		}
	}
	return keys
}

// waitCompleted waits until every effect of ids is completed, whichever
// Client delivered it (a Client's events are its own deliveries').
func waitCompleted(t *testing.T, b *bundle, ids []int64) {
	t.Helper()
	b.waitFor(t, fmt.Sprintf("%d effects completed", len(ids)), func() bool {
		return completedCount(t, b, ids) == int64(len(ids))
	})
}

// completedCount is how many effects of ids pgoutbox.effect_states reads
// completed.
func completedCount(t *testing.T, b *bundle, ids []int64) int64 {
	t.Helper()
	return b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE id = ANY($1) AND state = 'completed'`, ids)
}

// TestBatchStorageLanesDeliverAtOnce: two Clients of a batch queue with
// four lanes deliver two of its lanes at the same time, each from its own
// batch, woken by the enqueue's notification alone; with one lane, the
// second Client waits for the first one's batch.
func TestBatchStorageLanesDeliverAtOnce(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	started := make(chan string, 8)
	release := make(chan struct{})
	blocking := func(client string) pgoutbox.EffectType {
		return pgoutbox.EffectType{Name: "slow", ReplaySafe: true,
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				started <- client
				select {
				case <-release:
				case <-ctx.Done():
					return context.Cause(ctx)
				}
				seen.add(d)
				return nil
			}}
	}
	// No poll: a Client whose tick found the rows closed by the other's
	// claims the batch of another lane at once, or never.
	for _, c := range []string{"a", "b"} {
		cfg := lanesCfg("lq", 4, blocking(c))
		cfg.PollInterval = time.Hour
		b.startClient(t, cfg)
	}
	var effects []pgoutbox.Effect
	for _, k := range keysInLanes(t, b, 4) {
		effects = append(effects, pgoutbox.Effect{Queue: "lq", Type: "slow", Key: k, OrderingKey: k})
	}
	ids := b.enqueue(t, effects...)
	clients := map[string]bool{}
	for len(clients) < 2 {
		select {
		case c := <-started:
			clients[c] = true
		case <-b.ctx.Done():
			t.Fatalf("only client %v delivered: the second Client never leased another lane's batch", clients)
		}
	}
	close(release)
	waitCompleted(t, b, ids)
	for _, id := range ids {
		if n := seen.count(id); n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
	if n := b.count(t); n != 0 {
		t.Errorf("%d rows in pgoutbox.effects, want none: each lane's effects succeeded from their batch", n)
	}
	if n := b.scalar(t, `SELECT count(DISTINCT (slot_lo, slot_hi)) FROM pgoutbox.stream_batches WHERE queue = 'lq'`); n != 4 {
		t.Errorf("the tick wrote batches of %d slot ranges, want 4: one per lane", n)
	}
}

// TestBatchStorageLanesKeepKeyOrder: three Clients deliver a four-lane
// queue's effects, enqueued in many transactions over sixteen keys, each
// exactly once and each key's in enqueue order, though one fails once and
// its key's later effects move to pgoutbox.effects behind it.
func TestBatchStorageLanesKeepKeyOrder(t *testing.T) {
	b := setup(t)
	seen := newCounter()
	var failOnce sync.Once
	var failing int64
	var mu sync.Mutex
	typ := pgoutbox.EffectType{Name: "ord", ReplaySafe: true,
		Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
			mu.Lock()
			f := d.ID == failing
			mu.Unlock()
			var fail bool
			if f {
				failOnce.Do(func() { fail = true })
			}
			if fail {
				return pgoutbox.Retry(errors.New("not yet"))
			}
			seen.add(d)
			return nil
		}}
	for range 3 {
		b.startClient(t, lanesCfg("lq", 4, typ))
	}
	var ids []int64
	for tx := range 12 {
		var effects []pgoutbox.Effect
		for k := range 16 {
			effects = append(effects, pgoutbox.Effect{Queue: "lq", Type: "ord", Key: fmt.Sprintf("e%d-%d", tx, k),
				OrderingKey: fmt.Sprintf("key-%d", k)})
		}
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			got, err := pgoutbox.EnqueueBatch(b.ctx, tx, effects)
			ids = append(ids, got...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if tx == 0 {
			mu.Lock()
			failing = ids[5] // key-5's first effect
			mu.Unlock()
		}
	}
	waitCompleted(t, b, ids)
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for _, id := range ids {
		if n := seen.n[id]; n != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, n)
		}
	}
	for k := range 16 {
		key := fmt.Sprintf("key-%d", k)
		var want []int64
		for i, id := range ids {
			if i%16 == k {
				want = append(want, id)
			}
		}
		if got := seen.order[key]; !slices.Equal(got, want) {
			t.Errorf("%s delivered in order %v, want %v", key, got, want)
		}
	}
}

// TestBatchStorageLaneChangeWaitsForOverlap: after a queue's lanes go from
// one to four, the batches of the new lanes are not leased while the
// one-lane batch before them is open, so a key whose effects straddle the
// change keeps its order; once it settles, two Clients lease two lanes at
// once. Each effect's state (pgoutbox.effect_states) and the pending ones
// (pgoutbox.stream_pending) follow its own lane's batch.
func TestBatchStorageLaneChangeWaitsForOverlap(t *testing.T) {
	b := setup(t)
	setLanes := func(n int32) {
		t.Helper()
		if err := store.SetStorage(b.ctx, b.pool, []string{"lc"}, []string{store.StorageBatch}, []int32{n}); err != nil {
			t.Fatal(err)
		}
	}
	tick := func() {
		t.Helper()
		if ticked, err := store.Tick(b.ctx, b.pool, "lc"); err != nil || !ticked {
			t.Fatalf("tick: %v, %v", ticked, err)
		}
	}
	claim := func(owner string) (store.Batch, bool) {
		t.Helper()
		bt, ok, err := store.ClaimBatch(b.ctx, b.pool, "lc", owner, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return bt, ok
	}
	settle := func(bt store.Batch) {
		t.Helper()
		if found, err := store.Settle(b.ctx, b.pool, bt, "t", store.PageSettle{Through: bt.MaxID, Last: true}, nil); err != nil || !found {
			t.Fatalf("settle batch %d: %v, %v", bt.ID, found, err)
		}
	}
	state := func(id int64) string {
		t.Helper()
		var s string
		if err := b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effect_states WHERE id = $1`, id).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	keys := keysInLanes(t, b, 4)
	setLanes(1)
	before := b.enqueue(t, pgoutbox.Effect{Queue: "lc", Type: "t", Key: "k1", OrderingKey: keys[0]})[0]
	tick()
	setLanes(4)
	// Lane 3's effect between two of lane 0's: inside lane 0's batch's ids.
	after := b.enqueue(t, pgoutbox.Effect{Queue: "lc", Type: "t", Key: "k2", OrderingKey: keys[0]},
		pgoutbox.Effect{Queue: "lc", Type: "t", Key: "k3", OrderingKey: keys[3]},
		pgoutbox.Effect{Queue: "lc", Type: "t", Key: "k4", OrderingKey: keys[0]})
	tick()
	old, ok := claim("a")
	if !ok || old.SlotLo != 0 || old.SlotHi != 255 || old.MinID != before {
		t.Fatalf("first claim: %v, %+v; want the one-lane batch of effect %d", ok, old, before)
	}
	if bt, ok := claim("b"); ok {
		t.Fatalf("claim beside the open one-lane batch leased batch %d (slots %d-%d): %s's effect %d could run before %d",
			bt.ID, bt.SlotLo, bt.SlotHi, keys[0], after[0], before)
	}
	settle(old)
	first, ok1 := claim("b")
	second, ok2 := claim("c")
	if !ok1 || !ok2 {
		t.Fatalf("after the one-lane batch settled, two claims leased %v and %v, want two lanes", ok1, ok2)
	}
	if _, ok := claim("d"); ok {
		t.Fatal("a third claim leased a batch, want none: two lanes have rows")
	}
	lane0, lane3 := first, second
	if lane0.SlotLo != 0 {
		lane0, lane3 = second, first
	}
	if lane0.SlotLo != 0 || lane0.SlotHi != 63 || lane3.SlotLo != 192 || lane3.SlotHi != 255 {
		t.Fatalf("lane batches hold slots %d-%d and %d-%d, want 0-63 and 192-255", lane0.SlotLo, lane0.SlotHi,
			lane3.SlotLo, lane3.SlotHi)
	}
	page, err := store.Page(b.ctx, b.pool, lane3, lane3.DoneThrough, 10)
	if err != nil || len(page) != 1 || page[0].ID != after[1] {
		t.Fatalf("lane 3's page: %v, %v; want only effect %d", page, err, after[1])
	}
	page, err = store.Page(b.ctx, b.pool, lane0, lane0.DoneThrough, 10)
	if err != nil || len(page) != 2 || page[0].ID != after[0] || page[1].ID != after[2] {
		t.Fatalf("lane 0's page: %v, %v; want effects %d and %d, not lane 3's %d between them", page, err, after[0],
			after[2], after[1])
	}
	settle(lane3)
	if s := state(before); s != "completed" {
		t.Errorf("effect %d of the settled one-lane batch is %s, want completed", before, s)
	}
	if s := state(after[0]); s != "leased" {
		t.Errorf("effect %d of leased lane 0 is %s, want leased", after[0], s)
	}
	if s := state(after[2]); s != "leased" {
		t.Errorf("effect %d of leased lane 0 is %s, want leased", after[2], s)
	}
	if s := state(after[1]); s != "completed" {
		t.Errorf("effect %d of settled lane 3 is %s, want completed", after[1], s)
	}
	var pending []int64
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM pgoutbox.stream_pending WHERE queue = 'lc' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	if pending, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		t.Fatal(err)
	}
	if want := []int64{after[0], after[2]}; !slices.Equal(pending, want) {
		t.Errorf("pending stream effects %v, want %v, of the lane still open", pending, want)
	}
}

// TestBatchStorageLanesForgetSettledBatches: of the settled batches,
// stream_maintain keeps the newest of each slot range, one lane count's
// and the next's (the older lane-0 batch of four lanes is forgotten), so
// every effect still in the stream reads completed
// (pgoutbox.effect_states): a settled batch that sees an effect tells it
// is settled only when it holds the effect's slot.
func TestBatchStorageLanesForgetSettledBatches(t *testing.T) {
	b := setup(t)
	keys := keysInLanes(t, b, 4)
	round := 0
	deliver := func(lanes int32, orderingKeys ...string) []int64 {
		t.Helper()
		round++
		if err := store.SetStorage(b.ctx, b.pool, []string{"lf"}, []string{store.StorageBatch}, []int32{lanes}); err != nil {
			t.Fatal(err)
		}
		var effects []pgoutbox.Effect
		for _, k := range orderingKeys {
			effects = append(effects, pgoutbox.Effect{Queue: "lf", Type: "t", Key: fmt.Sprintf("%s-%d", k, round),
				OrderingKey: k})
		}
		ids := b.enqueue(t, effects...)
		if ticked, err := store.Tick(b.ctx, b.pool, "lf"); err != nil || !ticked {
			t.Fatalf("tick: %v, %v", ticked, err)
		}
		for {
			bt, ok, err := store.ClaimBatch(b.ctx, b.pool, "lf", "t", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return ids
			}
			if found, err := store.Settle(b.ctx, b.pool, bt, "t", store.PageSettle{Through: bt.MaxID, Last: true}, nil); err != nil || !found {
				t.Fatalf("settle batch %d: %v, %v", bt.ID, found, err)
			}
		}
	}
	ids := deliver(1, keys[0], keys[3])
	ids = append(ids, deliver(4, keys[0], keys[3])...)
	ids = append(ids, deliver(4, keys[0])...)
	ids = append(ids, deliver(2, keys[0])...)
	if _, err := store.StreamMaintain(b.ctx, b.pool, time.Hour, time.Hour); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT slot_lo::text || '-' || slot_hi FROM pgoutbox.stream_batches
        WHERE queue = 'lf' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0-255", "192-255", "0-63", "0-127"}; !slices.Equal(kept, want) {
		t.Errorf("settled batches kept by slot range %v, want %v: each range's newest", kept, want)
	}
	if n := completedCount(t, b, ids); n != int64(len(ids)) {
		t.Errorf("%d of the %d settled effects read completed", n, len(ids))
	}
}
