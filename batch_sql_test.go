package pgoutbox_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// sqlWorkerQueue records queue's storage from the storage test matrix
// (PGOUTBOX_TEST_STORAGE), as a Client of it would: the SQL worker tests
// start no Client, so without it they would test the row storage only.
func (b *bundle) sqlWorkerQueue(t *testing.T, queue string) {
	t.Helper()
	if s := withTestStorage(map[string]pgoutbox.QueueConfig{queue: {}})[queue].Storage; s != "" {
		if err := pgoutbox.SetStorage(b.ctx, b.pool, queue, s); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBatchStorageSQLWorker: the SQL API's workers (pgoutbox.claim, so the
// TypeScript Worker too) deliver a batch queue. Each claim moves the next
// page of the queue's oldest open batch into rows and claims them: every
// effect, enqueued through the SQL API in two batches, is claimed once,
// one ordering key's in id order across the batches, and nothing is left
// to deliver. While a consumer holds the oldest batch's lease, a claim
// moves nothing out of it; once that lease has expired, it takes the
// batch over.
func TestBatchStorageSQLWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "sw", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	// Six effects in one transaction, keyed a, b and none in turn.
	enqueue := func() []int64 {
		t.Helper()
		var pairs [][2]string
		for i := range 6 {
			pairs = append(pairs, [2]string{"t", []string{"a", "b", ""}[i%3]})
		}
		return b.enqueueSQL(t, "sw", pairs...)
	}
	want := enqueue()
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE queue = 'sw'`); n != 6 {
		t.Fatalf("%d stream rows after the SQL enqueue, want 6", n)
	}

	// A consumer holds the first batch: a claim moves nothing out of it.
	if _, err := store.Tick(b.ctx, b.pool, "sw"); err != nil {
		t.Fatal(err)
	}
	held, ok, err := store.ClaimBatch(b.ctx, b.pool, "sw", "go-consumer", time.Hour)
	if err != nil || !ok {
		t.Fatalf("lease the first batch: %v, %v", ok, err)
	}
	if leases, err := b.claimAs(t, "", "sw", 10); err != nil || len(leases) != 0 {
		t.Fatalf("claim beside a held batch lease: %v, %v; want nothing", leases, err)
	}
	// Its lease expires: the next claim takes the batch over.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.stream_batches SET lease_expires_at = now() - interval '1 second'
		WHERE queue = 'sw' AND id = $1`, held.ID); err != nil {
		t.Fatal(err)
	}

	delivered := map[int64]int{}
	order := map[string][]int64{}
	okeys := map[int64]string{}
	for i, id := range want {
		okeys[id] = []string{"a", "b", ""}[i%3]
	}
	for round := 0; ; round++ {
		if round == 1 {
			more := enqueue()
			want = append(want, more...)
			for i, id := range more {
				okeys[id] = []string{"a", "b", ""}[i%3]
			}
		}
		if round > 50 {
			t.Fatalf("no end after 50 claims; delivered %v", delivered)
		}
		leases, err := b.claimAs(t, "", "sw", 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) > 2 {
			t.Fatalf("claim of 2 returned %d", len(leases))
		}
		for _, l := range leases {
			delivered[l.ID]++
			if k := okeys[l.ID]; k != "" {
				order[k] = append(order[k], l.ID)
			}
			var done bool
			if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.complete($1, $2, $3)`, l.ID, l.Token, l.Type).Scan(&done); err != nil || !done {
				t.Fatalf("complete %d: %v, %v", l.ID, done, err)
			}
		}
		if len(leases) == 0 && round > 1 {
			break
		}
	}
	for _, id := range want {
		if delivered[id] != 1 {
			t.Errorf("effect %d claimed %d times, want once", id, delivered[id])
		}
	}
	if len(delivered) != len(want) {
		t.Errorf("%d effects claimed, want %d", len(delivered), len(want))
	}
	for k, ids := range order {
		if !slices.IsSorted(ids) {
			t.Errorf("key %s claimed in order %v", k, ids)
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_pending WHERE queue = 'sw'`); n != 0 {
		t.Errorf("%d stream effects still to deliver", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = 'sw' AND state <> 'completed'`); n != 0 {
		t.Errorf("%d effects of the queue not completed", n)
	}
	// The former holder's settle is fenced out.
	if found, err := store.Settle(b.ctx, b.pool, held, "go-consumer", store.PageSettle{Through: held.MaxID, Last: true}, nil); err != nil || found {
		t.Errorf("the former holder's settle: found %v, %v; want nothing written", found, err)
	}
}

// TestBatchStorageRoutedIsNotTrusted: a role that may only enqueue sets
// pgoutbox.routed, the engine's own marker for "the rows were routed to the
// stream already", before enqueueing into a batch queue: its effect still
// goes to the stream, not around it, so it cannot overtake an earlier
// effect of its ordering key.
func TestBatchStorageRoutedIsNotTrusted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "rq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	role := b.tempRole(t, "pgoutbox_enq_routed")
	b.grantEnqueue(t, role, "rq", "")
	var single, batched int64
	err := b.asRole(role, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL pgoutbox.routed = 'on'`); err != nil {
			return err
		}
		if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.enqueue('rq', 't', 'k1', ordering_key => 'o')`).Scan(&single); err != nil {
			return err
		}
		if _, err := tx.Exec(b.ctx, `SET LOCAL pgoutbox.routed = 'on'`); err != nil {
			return err
		}
		return tx.QueryRow(b.ctx, `SELECT id FROM pgoutbox.enqueue_batch('[{"queue":"rq","effect_type":"t","idempotency_key":"k2","ordering_key":"o"}]')`).Scan(&batched)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{single, batched} {
		if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1`, id); n != 0 {
			t.Errorf("effect %d went around the stream into pgoutbox.effects", id)
		}
		if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream WHERE id = $1`, id); n != 1 {
			t.Errorf("effect %d: %d stream rows, want 1", id, n)
		}
	}
}

// TestBatchStoragePageReadsOnlyItsPage: reading a page of a large batch
// reads about a page of rows, wherever the page is in the batch, with the
// stream's statistics unknown (its partitions are filled and truncated,
// seldom analyzed). A plan that reads the batch's remaining rows and sorts
// them makes draining a batch of N effects cost N^2/(2 x page) row reads.
func TestBatchStoragePageReadsOnlyItsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "big", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		SELECT 'big', 't', 'k' || g FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Tick(b.ctx, b.pool, "big"); err != nil {
		t.Fatal(err)
	}
	bt, ok, err := store.ClaimBatch(b.ctx, b.pool, "big", "me", time.Minute)
	if err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// Rows read from the stream's partitions, as this session's statistics
	// count them once flushed.
	read := func() int64 {
		t.Helper()
		if _, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
		var n int64
		if err := conn.QueryRow(b.ctx, `SELECT pg_stat_clear_snapshot() IS NULL`).Scan(new(bool)); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(b.ctx, `SELECT coalesce(sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)), 0)::bigint
			FROM pg_stat_user_tables WHERE schemaname = 'pgoutbox' AND relname LIKE 'stream\_%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := read()
	page, err := store.Page(b.ctx, conn, bt, bt.MinID+10000, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 100 {
		t.Fatalf("page of %d effects, want 100", len(page))
	}
	if n := read() - before; n > 300 {
		t.Errorf("a 100-effect page in the middle of a 20,000-effect batch read %d stream rows, want at most 300", n)
	}
}

// TestBatchStorageMaintenanceIsTheOwners: the stream's maintenance and
// reading functions run as their owner (or read tables the caller cannot);
// a role that may enqueue or work a queue may call none of them. Rotating
// the stream takes a lock that stalls every batch queue's writers, and
// truncates settled generations; a tick closes a batch of any queue.
func TestBatchStorageMaintenanceIsTheOwners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "mq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, pgoutbox.Effect{Queue: "mq", Type: "t", Key: "k"})
	enq := b.tempRole(t, "pgoutbox_enq_maint")
	b.grantEnqueue(t, enq, "mq", "")
	wrk := b.workerRole(t, "pgoutbox_wrk_maint")
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.grant_work($1, 'mq')`, wrk); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{enq, wrk} {
		for _, sql := range []string{
			`SELECT pgoutbox.stream_maintain(interval '0', interval '0')`,
			`SELECT pgoutbox.stream_tick('mq')`,
			`SELECT count(*) FROM pgoutbox.stream_after('mq', NULL)`,
			`SELECT count(*) FROM pgoutbox.stream_page('mq', 0, 100, pg_current_snapshot(), NULL, 10)`,
			`SELECT pgoutbox.stream_to_rows('mq', 10)`,
		} {
			if err := b.execAs(role, sql); pgCode(err) != "42501" {
				t.Errorf("%s as %s: %v, want 42501", sql, role, err)
			}
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = 'mq'`); n != 0 {
		t.Errorf("%d batches after the refused calls, want none", n)
	}
}

// TestBatchStorageReplayWaitsForItsPage: a move-on dead letter (A) of a
// batch queue is replayed while a Go consumer holds the batch that holds a
// later effect of its key (B), which runs from the batch and has no row:
// the SQL worker's claim (pgoutbox.claim, the engine's claim statement)
// does not take A while that page is in flight. The page's settle
// releases A's barrier and notifies the queue, and the next claim takes A.
// A second replay, while the batch's lease is held past its expiry, does
// not hold A back.
func TestBatchStorageReplayWaitsForItsPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const queue = "rp"
	if err := pgoutbox.SetStorage(b.ctx, b.pool, queue, pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.ordering_choices (queue, effect_type, dead_letter_moves_on)
		VALUES ($1, 'moveon', true)`, queue); err != nil {
		t.Fatal(err)
	}
	enqueue := func(typ, key string) int64 {
		t.Helper()
		var id int64
		if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.enqueue($1, $2, $3, ordering_key => 'k')`, queue, typ, key).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// lease ticks and leases the queue's next batch as a Go consumer does,
	// and reads its page.
	lease := func() (store.Batch, []store.Claimed) {
		t.Helper()
		if _, err := store.Tick(b.ctx, b.pool, queue); err != nil {
			t.Fatal(err)
		}
		bt, ok, err := store.ClaimBatch(b.ctx, b.pool, queue, "go-consumer", time.Hour)
		if err != nil || !ok {
			t.Fatalf("lease a batch: %v, %v", ok, err)
		}
		page, err := store.Page(b.ctx, b.pool, bt, bt.DoneThrough, 100)
		if err != nil {
			t.Fatal(err)
		}
		return bt, page
	}
	settle := func(bt store.Batch, moves ...store.Move) {
		t.Helper()
		if found, err := store.Settle(b.ctx, b.pool, bt, "go-consumer", store.PageSettle{Through: bt.MaxID, Last: true, Moves: moves}, nil); err != nil || !found {
			t.Fatalf("settle batch %d: %v, %v", bt.ID, found, err)
		}
	}
	replay := func(id int64) {
		t.Helper()
		if _, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{IDs: []int64{id}}); err != nil {
			t.Fatal(err)
		}
	}
	claimed := func() []int64 {
		t.Helper()
		leases, err := b.claimAs(t, "", queue, 10)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for _, l := range leases {
			ids = append(ids, l.ID)
		}
		return ids
	}

	// A runs from its batch and dead-letters.
	a := enqueue("moveon", "A")
	first, page := lease()
	if len(page) != 1 || page[0].ID != a {
		t.Fatalf("first page %v, want A (%d)", page, a)
	}
	settle(first, store.Move{Effect: page[0], State: "dead_letter", Attempts: 1, Error: "422"})
	// B, of A's key, moves on past it: its page is in flight.
	enqueue("strict", "B")
	second, _ := lease()
	replay(a)
	if got := claimed(); len(got) != 0 {
		t.Fatalf("claim while B's page is in flight: %v, want nothing (A waits for B)", got)
	}

	listener := listen(t, b)
	settle(second) // B was delivered from the batch: no row
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.replay_barriers`); n != 0 {
		t.Errorf("%d replay barriers left after the page settled", n)
	}
	n, err := listener.Conn().WaitForNotification(b.ctx)
	if err != nil || n.Payload != queue {
		t.Fatalf("notification after the settle: %v, %v; want one for %s", n, err, queue)
	}
	if _, err := listener.Exec(b.ctx, `UNLISTEN *`); err != nil {
		t.Fatal(err)
	}
	got := claimed()
	if !slices.Equal(got, []int64{a}) {
		t.Fatalf("claim after B's page settled: %v, want A (%d)", got, a)
	}

	// A dead-letters again (under its row lease); C of its key runs from a
	// batch whose lease has expired: replayed now, A is claimed at once.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET state = 'dead_letter', dead_lettered_at = now(),
		lease_token = NULL WHERE id = $1`, a); err != nil {
		t.Fatal(err)
	}
	enqueue("strict", "C")
	third, _ := lease()
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.stream_batches SET lease_expires_at = now() - interval '1 second'
		WHERE queue = $1 AND id = $2`, queue, third.ID); err != nil {
		t.Fatal(err)
	}
	replay(a)
	if got := claimed(); !slices.Contains(got, a) {
		t.Fatalf("claim beside an expired batch lease: %v, want A (%d) among them", got, a)
	}
}
