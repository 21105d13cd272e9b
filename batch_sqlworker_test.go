package pgoutbox_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// batchLease is one row of pgoutbox.claim_batch (migration 00032).
type batchLease struct {
	Batch   int64
	Token   uuid.UUID
	Through int64
	ID      int64
	Type    string
	Key     string
	Attempt int
}

// batchQueues records queues' storage as batch, as a Client of them would.
func (b *bundle) batchQueues(t *testing.T, queues ...string) {
	t.Helper()
	for _, q := range queues {
		if err := pgoutbox.SetStorage(b.ctx, b.pool, q, pgoutbox.StorageBatch); err != nil {
			t.Fatal(err)
		}
	}
}

// claimBatchAs runs pgoutbox.claim_batch as role (the owner when empty)
// for the replay-safe types.
func (b *bundle) claimBatchAs(t *testing.T, role, queue string, max int, types ...string) ([]batchLease, error) {
	t.Helper()
	var out []batchLease
	run := func(tx pgx.Tx) error {
		rows, err := tx.Query(b.ctx, `SELECT batch_id, batch_token, through, id, effect_type, coalesce(ordering_key, ''),
			attempt FROM pgoutbox.claim_batch($1, 'w1', $2, $3, interval '30 seconds')`, queue, types, max)
		if err != nil {
			return err
		}
		var l batchLease
		_, err = pgx.ForEachRow(rows, []any{&l.Batch, &l.Token, &l.Through, &l.ID, &l.Type, &l.Key, &l.Attempt},
			func() error { out = append(out, l); return nil })
		return err
	}
	if role == "" {
		return out, pgx.BeginFunc(b.ctx, b.pool, run)
	}
	return out, b.asRole(role, run)
}

// text reads one text value as the owner.
func (b *bundle) text(t *testing.T, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(b.ctx, sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// settleBatch settles the page of leases (one claim_batch's rows) as the
// owner: failed maps an id to its outcome; every other lease was delivered.
func (b *bundle) settleBatch(t *testing.T, queue string, leases []batchLease, failed map[int64]string) bool {
	t.Helper()
	done, bad := []int64{}, []int64{}
	outcomes, errs := []string{}, []string{}
	for _, l := range leases {
		if o, ok := failed[l.ID]; ok {
			bad, outcomes, errs = append(bad, l.ID), append(outcomes, o), append(errs, "boom "+o)
			continue
		}
		done = append(done, l.ID)
	}
	var found bool
	err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.settle_batch($1, $2, $3, $4, 'w1', $5, $6, $7, $8)`, queue,
		leases[0].Batch, leases[0].Token, leases[0].Through, done, bad, outcomes, errs).Scan(&found)
	if err != nil {
		t.Fatalf("settle_batch: %v", err)
	}
	return found
}

// staleSettle runs settle a second time for a page already settled (what
// names it): it must find the lease gone (false) and change no effect.
func (b *bundle) staleSettle(t *testing.T, what string, settle func() bool) {
	t.Helper()
	before := b.effectsDigest(t)
	if settle() {
		t.Errorf("a second %s of the page matched the lease", what)
	}
	if after := b.effectsDigest(t); after != before {
		t.Errorf("a stale %s changed the effects:\n%s\nwas\n%s", what, after, before)
	}
}

// enqueueSQL enqueues one effect per (type, ordering key) pair through the
// SQL API in one transaction and returns their ids.
func (b *bundle) enqueueSQL(t *testing.T, queue string, pairs ...[2]string) []int64 {
	t.Helper()
	var ids []int64
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, p := range pairs {
			var id int64
			if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.enqueue($1, $2, $3, ordering_key => nullif($4, ''))`,
				queue, p[0], uuid.NewString(), p[1]).Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// claimEach claims queue's effects through pgoutbox.claim one round at a
// time, at most rounds, completing each: every round must take at most one
// effect (a key's effects one at a time). It returns them in claim order.
func (b *bundle) claimEach(t *testing.T, queue string, rounds int) []int64 {
	t.Helper()
	var order []int64
	for range rounds {
		ls, err := b.claimAs(t, "", queue, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) == 0 {
			break
		}
		if len(ls) != 1 {
			t.Fatalf("the row claim took %v at once: one effect of the key at a time", ls)
		}
		order = append(order, ls[0].ID)
		if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.complete($1, $2, $3)`, ls[0].ID, ls[0].Token, ls[0].Type); err != nil {
			t.Fatal(err)
		}
	}
	return order
}

// TestSQLBatchWorker: a worker in any language delivers a batch queue from
// its batch (pgoutbox.claim_batch, settle_batch; migration 00032), writing
// nothing per effect delivered. A claim returns the effects of the types it
// names, the first of each ordering key in the page; its settle counts the
// delivered ones (status sees them completed), moves the failed one to the
// row storage with its attempt and backoff, and every other effect of the
// page (another type, a key's later effects) unrun, behind its key's head,
// for the row claim. A second settle of the page is fenced out.
func TestSQLBatchWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sb")
	ids := b.enqueueSQL(t, "sb",
		[2]string{"t", "a"}, [2]string{"t", "a"}, [2]string{"t", ""}, [2]string{"u", ""},
		[2]string{"t", "b"}, [2]string{"t", ""}, [2]string{"u", "c"}, [2]string{"t", "c"})
	// A row claim with from_stream false moves nothing out of the stream.
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.claim('sb', 'w1', 10, interval '30 seconds', false)`); n != 0 {
		t.Fatalf("claim(from_stream => false) claimed %d effects of the stream", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'sb'`); n != 0 {
		t.Fatalf("claim(from_stream => false) moved %d effects into rows", n)
	}
	leases, err := b.claimBatchAs(t, "", "sb", 100, "t")
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, l := range leases {
		got = append(got, l.ID)
		if l.Attempt != 1 || l.Batch != leases[0].Batch || l.Token != leases[0].Token || l.Through < ids[7] {
			t.Errorf("lease %+v: want attempt 1, one batch and token, through the page's end", l)
		}
	}
	// a's head, the two without a key, b's head: not a's second, not the
	// u type, not c's second (its head is of type u).
	if want := []int64{ids[0], ids[2], ids[4], ids[5]}; !slices.Equal(got, want) {
		t.Fatalf("claim_batch returned %v, want %v", got, want)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'sb'`); n != 0 {
		t.Fatalf("%d rows in pgoutbox.effects after the claim, want none", n)
	}
	if !b.settleBatch(t, "sb", leases, map[int64]string{ids[4]: "retry"}) {
		t.Fatal("settle_batch: lease lost")
	}
	rows, err := b.pool.Query(b.ctx, `SELECT id, state::text, attempts, available_at > now(), coalesce(last_error, '')
		FROM pgoutbox.effects WHERE queue = 'sb' ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	var id int64
	var state, lastErr string
	var attempts int
	var later bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &state, &attempts, &later, &lastErr}, func() error {
		moved = append(moved, fmt.Sprintf("%d %s %d %t %s", id, state, attempts, later, lastErr))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("%d available 0 false ", ids[1]),
		fmt.Sprintf("%d available 0 false ", ids[3]),
		fmt.Sprintf("%d available 1 true boom retry", ids[4]),
		fmt.Sprintf("%d available 0 false ", ids[6]),
		fmt.Sprintf("%d available 0 false ", ids[7]),
	}
	if !slices.Equal(moved, want) {
		t.Fatalf("rows after the settle:\n%v\nwant\n%v", moved, want)
	}
	for _, i := range []int{0, 2, 5} {
		if s := b.text(t, `SELECT state FROM pgoutbox.effect_states WHERE id = $1`, ids[i]); s != "completed" {
			t.Errorf("delivered effect %d: state %q, want completed", ids[i], s)
		}
	}
	if n := b.scalar(t, `SELECT coalesce(sum(completed), 0) FROM pgoutbox.stream_settled WHERE queue = 'sb'`); n != 3 {
		t.Errorf("stream_settled counts %d completions, want 3", n)
	}
	b.staleSettle(t, "settle", func() bool { return b.settleBatch(t, "sb", leases, nil) })
	// The row claim takes what moved, a's second behind nothing now.
	rl, err := b.claimAs(t, "", "sb", 10)
	if err != nil {
		t.Fatal(err)
	}
	var rowIDs []int64
	for _, l := range rl {
		rowIDs = append(rowIDs, l.ID)
	}
	if want := []int64{ids[1], ids[3], ids[6]}; !slices.Equal(rowIDs, want) {
		t.Errorf("the row claim took %v, want %v (c's second waits for its head)", rowIDs, want)
	}
	if more, err := b.claimBatchAs(t, "", "sb", 100, "t"); err != nil || len(more) != 0 {
		t.Errorf("claim_batch after the batch: %v, %v; want nothing", more, err)
	}
}

// TestSQLBatchWorkerPagesAndLeases: pages of a batch are claimed one at a
// time per lane; a settled page releases the lease for the next claim;
// every effect is delivered once across pages; an effect whose key is held
// in pgoutbox.effects stays out of the claims; a holder whose lease
// expired is fenced out, and the batch's next claimer moves the page to
// the row storage with the attempt it may have had.
func TestSQLBatchWorkerPagesAndLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sp")
	// Key h is held: its first effect is dead-lettered in the row storage.
	held := b.enqueueSQL(t, "sp", [2]string{"t", "h"})
	var pairs [][2]string
	for i := range 10 {
		pairs = append(pairs, [2]string{"t", []string{"h", ""}[min(i%5, 1)]})
	}
	first, err := b.claimBatchAs(t, "", "sp", 100, "t")
	if err != nil || len(first) != 1 {
		t.Fatalf("claim the held key's head: %v, %v", first, err)
	}
	if !b.settleBatch(t, "sp", first, map[int64]string{held[0]: "permanent"}) {
		t.Fatal("settle: lease lost")
	}
	if s := b.text(t, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, held[0]); s != "dead_letter" {
		t.Fatalf("a permanent failure: %s, want dead_letter", s)
	}
	ids := b.enqueueSQL(t, "sp", pairs...)
	delivered := map[int64]int{}
	for round := 0; ; round++ {
		if round > 20 {
			t.Fatalf("no end after 20 claims: %v", delivered)
		}
		page, err := b.claimBatchAs(t, "", "sp", 3, "t")
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		// The lane is leased: a second claimer gets nothing.
		if other, err := b.claimBatchAs(t, "", "sp", 3, "t"); err != nil || len(other) != 0 {
			t.Fatalf("a claim beside a leased lane: %v, %v", other, err)
		}
		for _, l := range page {
			delivered[l.ID]++
			if l.Key == "h" {
				t.Errorf("effect %d of the held key was claimed", l.ID)
			}
		}
		if !b.settleBatch(t, "sp", page, nil) {
			t.Fatal("settle: lease lost")
		}
	}
	for _, id := range ids {
		if pairs[slices.Index(ids, id)][1] == "h" {
			continue
		}
		if delivered[id] != 1 {
			t.Errorf("effect %d delivered %d times, want once", id, delivered[id])
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'sp' AND state = 'available'
		AND ordering_key = 'h'`); n != 2 {
		t.Errorf("%d of the held key's effects wait in the row storage, want 2", n)
	}

	// A holder's lease expires: the next claimer takes the batch over.
	more := b.enqueueSQL(t, "sp", [2]string{"t", ""}, [2]string{"t", ""})
	stale, err := b.claimBatchAs(t, "", "sp", 100, "t")
	if err != nil || len(stale) != 2 {
		t.Fatalf("claim: %v, %v", stale, err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.stream_batches SET lease_expires_at = now() - interval '1 second'
		WHERE queue = 'sp' AND id = $1`, stale[0].Batch); err != nil {
		t.Fatal(err)
	}
	if again, err := b.claimBatchAs(t, "", "sp", 100, "t"); err != nil || len(again) != 0 {
		t.Fatalf("the claim after an expired lease: %v, %v; want the page moved to rows", again, err)
	}
	for _, id := range more {
		if n := b.scalar(t, `SELECT attempts FROM pgoutbox.effects WHERE id = $1 AND state = 'available'`, id); n != 1 {
			t.Errorf("effect %d of the expired batch: %d attempts in the row storage, want 1", id, n)
		}
	}
	before := b.effectsDigest(t)
	if b.settleBatch(t, "sp", stale, nil) {
		t.Error("the expired holder's settle matched the lease")
	}
	if after := b.effectsDigest(t); after != before {
		t.Errorf("the expired holder's settle changed the effects:\n%s\nwas\n%s", after, before)
	}
}

// The batch worker functions work only a granted queue, and each argument
// is bounded: a refusal (42501, OB001) changes nothing, neither an effect
// nor the batch's lease and settled position. A settle may name only the
// effects claim_batch returned for the page.
func TestSQLBatchWorkerRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sr", "other")
	ids := b.enqueueSQL(t, "sr", [2]string{"t", "k"}, [2]string{"t", "k"}, [2]string{"t", ""})
	b.enqueueSQL(t, "other", [2]string{"t", ""})
	role := b.workerRole(t, "pgoutbox_bworker_test")
	digest := func() string {
		return b.effectsDigest(t) + b.text(t, `SELECT coalesce(string_agg(format('%s %s %s %s', queue, id,
			coalesce(lease_token::text, '-'), done_through), ';' ORDER BY queue, id), '') FROM pgoutbox.stream_batches`)
	}
	refusedIn := func(t *testing.T, code, as, sql string, args ...any) {
		t.Helper()
		before := digest()
		var err error
		if as == "" {
			_, err = b.pool.Exec(b.ctx, sql, args...)
		} else {
			err = b.execAs(as, sql, args...)
		}
		if pgCode(err) != code {
			t.Fatalf("%s: %v, want %s", sql, err, code)
		}
		if after := digest(); after != before {
			t.Fatalf("a refused %s changed:\n%s\nwas\n%s", sql, after, before)
		}
	}
	refused := func(code, as, sql string, args ...any) {
		t.Helper()
		refusedIn(t, code, as, sql, args...)
	}
	fake := uuid.New()
	refused("42501", role, `SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY['t'])`)
	refused("42501", role, `SELECT pgoutbox.settle_batch('sr', 1, $1, 1, 'w1', '{}')`, fake)
	refused("42501", role, `SELECT pgoutbox.extend_batch('sr', 1, $1)`, fake)
	refused("42501", role, `SELECT * FROM pgoutbox.settle_page('sr', 1, $1, 1, 'w1', '{}', running => '{1}')`, fake)
	enq := b.tempRole(t, "pgoutbox_benq_test")
	refused("42501", enq, `SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY['t'])`)
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.grant_work($1, 'sr')`, role); err != nil {
		t.Fatal(err)
	}
	refused("42501", role, `SELECT * FROM pgoutbox.claim_batch('other', 'w1', ARRAY['t'])`)
	refused("42501", role, `SELECT * FROM pgoutbox.work_claim_batch('sr', 'w1', 30)`)
	refused("42501", role, `SELECT pgoutbox.stream_settle_page('sr', 1, $1, 1, true, 'w1', '{}', '{}', '{}', '{}',
		'{}', '{}', '{}')`, fake)
	refused("42501", role, `SELECT pgoutbox.stream_settle_page('sr', 1, $1, 1, true, 'w1', '{}', '{}', '{}', '{}',
		'{}', '{}', '{}', '{}', 30)`, fake)
	for _, bad := range []string{
		`SELECT * FROM pgoutbox.claim_batch('sr', '', ARRAY['t'])`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY['t'], 0)`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY['t'], 1001)`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', '{}')`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY[NULL::text])`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', array_fill('t'::text, ARRAY[101]))`,
		`SELECT * FROM pgoutbox.claim_batch('sr', 'w1', ARRAY['t'], 10, interval '0')`,
		`SELECT pgoutbox.extend_batch('sr', 1, gen_random_uuid(), interval '2 days')`,
		`SELECT * FROM pgoutbox.claim('sr', 'w1', 1, interval '30 seconds', NULL)`,
	} {
		refused("OB001", role, bad)
	}

	page, err := b.claimBatchAs(t, role, "sr", 100, "t")
	if err != nil || len(page) != 2 || page[0].ID != ids[0] || page[1].ID != ids[2] {
		t.Fatalf("the granted role's claim_batch: %v, %v; want effects %d and %d", page, err, ids[0], ids[2])
	}
	bt, tok, through := page[0].Batch, page[0].Token, page[0].Through
	settle := `SELECT pgoutbox.settle_batch('sr', $1, $2, $3, 'w1', $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::interval[])`
	for _, c := range []struct {
		name                  string
		through               int64
		delivered, failed     []int64
		outcomes, errs, after []string
	}{
		{"a key's second effect", through, []int64{ids[0], ids[1]}, nil, nil, nil, nil},
		{"an id of no page", through, []int64{ids[0] + 1000}, nil, nil, nil, nil},
		{"an id twice", through, []int64{ids[0]}, []int64{ids[0]}, []string{"retry"}, []string{"x"}, nil},
		{"through past the batch", through + 1000, []int64{ids[0]}, nil, nil, nil, nil},
		{"through before the page", 0, []int64{ids[0]}, nil, nil, nil, nil},
		{"an unknown outcome", through, nil, []int64{ids[0]}, []string{"maybe"}, []string{"x"}, nil},
		{"outcomes shorter than failed", through, nil, []int64{ids[0], ids[2]}, []string{"retry"}, []string{"x", "y"}, nil},
		{"retry_after without its interval", through, nil, []int64{ids[0]}, []string{"retry_after"}, []string{"x"}, nil},
		{"an interval without retry_after", through, nil, []int64{ids[0]}, []string{"retry"}, []string{"x"}, []string{"1 minute"}},
		{"an error over 64 KiB", through, nil, []int64{ids[0]}, []string{"retry"}, []string{string(make([]byte, 65537))}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.outcomes == nil {
				c.outcomes, c.errs = []string{}, []string{}
			}
			if c.failed == nil {
				c.failed = []int64{}
			}
			if c.after == nil {
				c.after = []string{}
			}
			for i := range c.errs {
				if len(c.errs[i]) > 65536 {
					c.errs[i] = fmt.Sprintf("%065537d", 0)
				}
			}
			refusedIn(t, "OB001", role, settle, bt, tok, c.through, c.delivered, c.failed, c.outcomes, c.errs, c.after)
		})
	}
	// settle_page's running (migration 00033) is bounded as delivered is.
	settlePage := `SELECT * FROM pgoutbox.settle_page('sr', $1, $2, $3, 'w1', $4::bigint[], running => $5::bigint[],
		lease => $6::interval)`
	for _, c := range []struct {
		name               string
		delivered, running []int64
		lease              string
	}{
		{"running a key's second effect", []int64{ids[0]}, []int64{ids[1]}, "30 seconds"},
		{"running an id delivered names", []int64{ids[0]}, []int64{ids[0]}, "30 seconds"},
		{"running an id of no page", nil, []int64{ids[0] + 1000}, "30 seconds"},
		{"running NULL", nil, nil, "30 seconds"},
		{"a lease under a second", nil, []int64{ids[2]}, "0.5 seconds"},
		{"a lease over a day", nil, []int64{ids[2]}, "25 hours"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.delivered == nil {
				c.delivered = []int64{}
			}
			var running any = c.running
			if c.running == nil {
				running = []*int64{nil}
			}
			refusedIn(t, "OB001", role, settlePage, bt, tok, through, c.delivered, running, c.lease)
		})
	}
	// Another queue's batch is refused though its token is right.
	refused("42501", role, `SELECT pgoutbox.settle_batch('other', $1, $2, $3, 'w1', '{}')`, bt, tok, through)

	var ok bool
	if err := b.asRole(role, func(tx pgx.Tx) error {
		if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.extend_batch('sr', $1, $2, interval '1 minute')`, bt, tok).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("extend_batch: %v, %v", ok, err)
		}
		return tx.QueryRow(b.ctx, settle, bt, tok, through, []int64{ids[0], ids[2]}, []int64{}, []string{}, []string{},
			[]string{}).Scan(&ok)
	}); err != nil || !ok {
		t.Fatalf("the granted role's settle: %v, %v", ok, err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'sr'`); n != 1 {
		t.Errorf("%d rows in pgoutbox.effects after the settle, want 1 (the key's second)", n)
	}
}

// TestSQLBatchWorkerKeepsKeyOrder: a key's head that fails in its batch
// page holds the key's later effects, in later pages, until it is
// delivered: they are not returned by claim_batch but moved behind it, and
// the row claim delivers the key in order.
func TestSQLBatchWorkerKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "so")
	var pairs [][2]string
	for range 3 {
		pairs = append(pairs, [2]string{"t", "k"}, [2]string{"t", ""})
	}
	ids := b.enqueueSQL(t, "so", pairs...)
	var fromBatch []int64
	for page := 0; ; page++ {
		if page > 10 {
			t.Fatal("no end after 10 pages")
		}
		leases, err := b.claimBatchAs(t, "", "so", 2, "t")
		if err != nil {
			t.Fatal(err)
		}
		if len(leases) == 0 {
			break
		}
		failed := map[int64]string{}
		for _, l := range leases {
			fromBatch = append(fromBatch, l.ID)
			if l.ID == ids[0] {
				failed[l.ID] = "retry"
			}
		}
		if !b.settleBatch(t, "so", leases, failed) {
			t.Fatal("settle: lease lost")
		}
	}
	if want := []int64{ids[0], ids[1], ids[3], ids[5]}; !slices.Equal(fromBatch, want) {
		t.Fatalf("claim_batch returned %v, want %v: the key's later effects wait behind its failed head", fromBatch, want)
	}
	// The head's backoff over, the row claim delivers the key in order.
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET available_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	order := b.claimEach(t, "so", 5)
	if want := []int64{ids[0], ids[2], ids[4]}; !slices.Equal(order, want) {
		t.Errorf("the key was delivered in order %v, want %v", order, want)
	}
}

// TestSQLBatchWorkerPromotesRunning: pgoutbox.settle_page (migration 00033)
// settles a page while some of its handlers still run, as the Go Client
// does at PageHold: each running effect moves to pgoutbox.effects leased to
// the worker, its attempt counted, with a token of its own that the settle
// returns; the worker completes it there with pgoutbox.complete, and no
// other claim takes it meanwhile. What did not start moves unrun; the
// batch's lease goes back at once. A stale settle_page changes nothing.
func TestSQLBatchWorkerPromotesRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sp")
	ids := b.enqueueSQL(t, "sp", [2]string{"t", "a"}, [2]string{"t", ""}, [2]string{"t", "b"}, [2]string{"t", ""})
	leases, err := b.claimBatchAs(t, "", "sp", 100, "t")
	if err != nil || len(leases) != 4 {
		t.Fatalf("claim_batch: %v, %v; want the 4 effects", leases, err)
	}
	settle := func() (bool, []int64, []uuid.UUID) {
		t.Helper()
		var ok bool
		var leaseIDs []int64
		var tokens []uuid.UUID
		err := b.pool.QueryRow(b.ctx, `SELECT settled, lease_ids, lease_tokens FROM pgoutbox.settle_page('sp', $1, $2, $3,
			'w1', $4, ARRAY[$5::bigint], ARRAY['retry'], ARRAY['boom'], running => ARRAY[$6::bigint],
			lease => interval '1 hour')`, leases[0].Batch, leases[0].Token, leases[0].Through, []int64{ids[0]}, ids[1],
			ids[2]).Scan(&ok, &leaseIDs, &tokens)
		if err != nil {
			t.Fatalf("settle_page: %v", err)
		}
		return ok, leaseIDs, tokens
	}
	ok, leaseIDs, tokens := settle()
	if !ok || !slices.Equal(leaseIDs, []int64{ids[2]}) || len(tokens) != 1 || tokens[0] == uuid.Nil {
		t.Fatalf("settle_page: settled %t, lease_ids %v, lease_tokens %v; want true, [%d] and one token",
			ok, leaseIDs, tokens, ids[2])
	}
	row := func(id int64) string {
		return b.text(t, `SELECT format('%s %s %s %s %s', state, attempts, coalesce(lease_owner, '-'),
			coalesce(lease_token = $2, false), coalesce(lease_expires_at > now() + interval '50 minutes', false))
			FROM pgoutbox.effects WHERE id = $1`, id, tokens[0])
	}
	for id, want := range map[int64]string{
		ids[1]: "available 1 - f f", // failed: retried after its backoff
		ids[2]: "leased 1 w1 t t",   // running: promoted to the worker's lease of an hour
		ids[3]: "available 0 - f f", // not started: moved unrun
	} {
		if got := row(id); got != want {
			t.Errorf("effect %d after settle_page: %q, want %q", id, got, want)
		}
	}
	if s := b.text(t, `SELECT state FROM pgoutbox.effect_states WHERE id = $1`, ids[0]); s != "completed" {
		t.Errorf("the delivered effect: %q, want completed", s)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = 'sp' AND lease_token IS NOT NULL`); n != 0 {
		t.Errorf("%d batches still leased after settle_page, want none", n)
	}
	b.staleSettle(t, "settle_page", func() bool { ok, _, _ := settle(); return ok })
	// The promoted effect is the worker's: a row claim does not take it.
	rl, err := b.claimAs(t, "", "sp", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rl {
		if l.ID == ids[2] {
			t.Fatalf("a row claim took the promoted effect %d while its lease holds", ids[2])
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.complete($1, $2, 't') c WHERE c`, ids[2], tokens[0]); n != 1 {
		t.Fatal("pgoutbox.complete with the promoted lease's token did not complete it")
	}
	if got := b.text(t, `SELECT format('%s %s', state, attempts) FROM pgoutbox.effects WHERE id = $1`, ids[2]); got != "completed 1" {
		t.Errorf("the promoted effect after complete: %q, want completed 1", got)
	}
}

// TestSQLBatchWorkerSwitchedBackToRows: a queue switched from batch
// storage back to rows before its stream's last effects were ticked still
// has them delivered by SQL workers (migration 00033): claim_batch ticks
// and delivers them from the batch, and pgoutbox.claim moves them into rows.
func TestSQLBatchWorkerSwitchedBackToRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "back1", "back2")
	one := b.enqueueSQL(t, "back1", [2]string{"t", ""}, [2]string{"t", ""})
	two := b.enqueueSQL(t, "back2", [2]string{"t", ""})
	for _, q := range []string{"back1", "back2"} {
		if err := pgoutbox.SetStorage(b.ctx, b.pool, q, pgoutbox.StorageRows); err != nil {
			t.Fatal(err)
		}
	}
	leases, err := b.claimBatchAs(t, "", "back1", 100, "t")
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, l := range leases {
		got = append(got, l.ID)
	}
	if !slices.Equal(got, one) {
		t.Fatalf("claim_batch on the switched queue returned %v, want its stream's %v", got, one)
	}
	if !b.settleBatch(t, "back1", leases, nil) {
		t.Fatal("settle_batch: lease lost")
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = 'back1' AND state = 'completed'`); n != 2 {
		t.Errorf("%d effects of back1 completed, want 2", n)
	}
	rl, err := b.claimAs(t, "", "back2", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rl) != 1 || rl[0].ID != two[0] {
		t.Fatalf("claim on the switched queue took %v, want its stream's effect %d", rl, two[0])
	}
}

// TestSQLBatchWorkerSwitchedBackKeepsKeyOrder: after a queue's storage
// goes from batch back to rows, an effect enqueued then is written to
// pgoutbox.effects while earlier effects of its ordering key are still in
// the stream. The row claim does not take it while they are (migration
// 00034): not while the batch page that started before it delivers the
// key's head, nor before the key's second effect, which that page's
// settle moves into rows. An unordered effect is claimed at once.
func TestSQLBatchWorkerSwitchedBackKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sbk")
	streamed := b.enqueueSQL(t, "sbk", [2]string{"t", "k"}, [2]string{"t", "k"})
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "sbk", pgoutbox.StorageRows); err != nil {
		t.Fatal(err)
	}
	page, err := b.claimBatchAs(t, "", "sbk", 10, "t")
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 1 || page[0].ID != streamed[0] {
		t.Fatalf("claim_batch returned %v, want the key's head %d", page, streamed[0])
	}
	// Enqueued while the page runs (a page that starts later moves the
	// key's stream effects behind one that pgoutbox.effects holds).
	rowed := b.enqueueSQL(t, "sbk", [2]string{"t", "k"}, [2]string{"t", ""})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = ANY($1)`, rowed); n != 2 {
		t.Fatalf("%d of the effects enqueued after the switch in pgoutbox.effects, want 2", n)
	}
	// The page delivers the key's head: the row claim takes only the
	// unordered effect.
	ls, err := b.claimAs(t, "", "sbk", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].ID != rowed[1] {
		t.Fatalf("the row claim took %v while the key's head %d was delivered from the batch, want only the unordered %d",
			ls, streamed[0], rowed[1])
	}
	// The console lists it as waiting.
	if rows, err := store.EffectsByID(b.ctx, b.pool, rowed[:1]); err != nil || len(rows) != 1 || !rows[0].Waiting {
		t.Errorf("the console's row of effect %d: %+v, %v; want it waiting behind the stream", rowed[0], rows, err)
	}
	if !b.settleBatch(t, "sbk", page, nil) {
		t.Fatal("settle_batch: lease lost")
	}
	order := append([]int64{streamed[0]}, b.claimEach(t, "sbk", 3)...)
	if want := []int64{streamed[0], streamed[1], rowed[0]}; !slices.Equal(order, want) {
		t.Errorf("the key was delivered in order %v, want %v", order, want)
	}
}

// TestSQLBatchWorkerSwitchedBackWaitsForUnticked: the stream's effects of
// a queue switched back to rows that no tick has closed into a batch yet
// hold its ordered effects in rows too (migration 00034): a row claim that
// does not move the stream (from_stream false) takes only the unordered
// one; pgoutbox.claim, which ticks and moves it, then delivers the key in
// order.
func TestSQLBatchWorkerSwitchedBackWaitsForUnticked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sbt")
	streamed := b.enqueueSQL(t, "sbt", [2]string{"t", "k"})
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "sbt", pgoutbox.StorageRows); err != nil {
		t.Fatal(err)
	}
	rowed := b.enqueueSQL(t, "sbt", [2]string{"t", "k"}, [2]string{"t", ""})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = 'sbt'`); n != 0 {
		t.Fatalf("%d batches of the queue, want none: its stream effect not ticked", n)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM pgoutbox.claim('sbt', 'w1', 10, interval '30 seconds', from_stream => false)`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, rowed[1:]) {
		t.Fatalf("a row claim took %v while the key's head %d waited in the stream, not ticked; want only the unordered %v",
			got, streamed[0], rowed[1:])
	}
	order := b.claimEach(t, "sbt", 3)
	if want := []int64{streamed[0], rowed[0]}; !slices.Equal(order, want) {
		t.Errorf("the key was delivered in order %v, want %v", order, want)
	}
}

// TestLeftBatchCleared: a queue whose storage leaves batch is marked
// (queue_storage.left_batch_at, migration 00034), so that its claims read
// its stream's floor; Client.Prune clears the mark once the stream holds
// none of its effects unsettled (not while one waits unticked, nor while
// a page delivers it) and no transaction holds an ordering lock (one that
// does may be a producer that read the storage as batch). Going back to
// batch clears it; leaving batch again sets it.
func TestLeftBatchCleared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	left := func() bool {
		t.Helper()
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.queue_storage WHERE queue = 'cl' AND left_batch_at IS NOT NULL`) == 1
	}
	setStorage := func(s pgoutbox.Storage) {
		t.Helper()
		if err := pgoutbox.SetStorage(b.ctx, b.pool, "cl", s); err != nil {
			t.Fatal(err)
		}
	}
	c := b.newStopped(t, pgoutbox.Config{Queues: map[string]pgoutbox.QueueConfig{"other": {}}})
	prune := func() {
		t.Helper()
		if _, err := c.Prune(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.batchQueues(t, "cl")
	b.enqueueSQL(t, "cl", [2]string{"t", "k"})
	if left() {
		t.Fatal("a queue of batch storage is marked as having left it")
	}
	setStorage(pgoutbox.StorageRows)
	if !left() {
		t.Fatal("the queue's storage left batch and it is not marked")
	}
	prune()
	if !left() {
		t.Fatal("Prune cleared the mark while the stream holds the queue's effect")
	}
	// A worker delivers it from its batch: the stream holds it settled.
	page, err := b.claimBatchAs(t, "", "cl", 10, "t")
	if err != nil || len(page) != 1 {
		t.Fatalf("claim_batch = %v, %v; want the queue's one effect", page, err)
	}
	prune()
	if !left() {
		t.Fatal("Prune cleared the mark while a batch page delivers the queue's effect")
	}
	if !b.settleBatch(t, "cl", page, nil) {
		t.Fatal("settle_batch: lease lost")
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck
	if _, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "other", Type: "t", Key: "held", OrderingKey: "k"}); err != nil {
		t.Fatal(err)
	}
	prune()
	if !left() {
		t.Fatal("Prune cleared the mark while a transaction holds an ordering lock")
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	prune()
	if left() {
		t.Fatal("Prune left the mark of a queue whose stream holds nothing unsettled")
	}
	setStorage(pgoutbox.StorageBatch)
	setStorage(pgoutbox.StorageRows)
	if !left() {
		t.Fatal("the queue left batch a second time and it is not marked")
	}
	setStorage(pgoutbox.StorageBatch)
	if left() {
		t.Fatal("a queue back in batch storage is still marked")
	}
}

// TestSQLBatchWorkerSwitchedBackNotifiesFloor: a page of a queue switched
// back to rows that settles without moving anything into pgoutbox.effects
// notifies the queue's channel (migration 00037), so the row claimer of
// the key's next effect, held behind the stream, wakes; a batch queue's
// settle does not. Each check reads the notifications up to a sentinel
// enqueued after the settle committed (notifications).
func TestSQLBatchWorkerSwitchedBackNotifiesFloor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.batchQueues(t, "sbn", "sbb")
	streamed := b.enqueueSQL(t, "sbn", [2]string{"t", "k"})
	b.enqueueSQL(t, "sbb", [2]string{"t", "k"})
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "sbn", pgoutbox.StorageRows); err != nil {
		t.Fatal(err)
	}
	switched, err := b.claimBatchAs(t, "", "sbn", 10, "t")
	if err != nil || len(switched) != 1 || switched[0].ID != streamed[0] {
		t.Fatalf("claim_batch returned %v, %v; want the key's head %d", switched, err, streamed[0])
	}
	held := b.enqueueSQL(t, "sbn", [2]string{"t", "k"})
	batched, err := b.claimBatchAs(t, "", "sbb", 10, "t")
	if err != nil || len(batched) != 1 {
		t.Fatalf("claim_batch of the batch queue returned %v, %v; want its effect", batched, err)
	}

	listener := listen(t, b)
	sentinels := 0
	heard := func(settle func()) map[string]int {
		t.Helper()
		settle()
		// A queue of its own each time: the limiter (migration 00005)
		// folds a queue's notifications close together.
		sentinels++
		sentinel := fmt.Sprintf("sentinel%d", sentinels)
		got := notifications(t, b, listener, sentinel)
		delete(got, sentinel)
		return got
	}
	if got := heard(func() {
		if !b.settleBatch(t, "sbb", batched, nil) {
			t.Fatal("settle_batch of the batch queue: lease lost")
		}
	}); len(got) != 0 {
		t.Errorf("a batch queue's settle notified %v, want nothing", got)
	}
	if got := heard(func() {
		if !b.settleBatch(t, "sbn", switched, nil) {
			t.Fatal("settle_batch: lease lost")
		}
	}); len(got) != 1 || got["sbn"] != 1 {
		t.Errorf("the switched-back queue's settle notified %v, want sbn once: its held effect %d is claimable now", got, held[0])
	}
	if _, err := listener.Exec(b.ctx, `UNLISTEN *`); err != nil {
		t.Fatal(err)
	}
	if got := b.claimEach(t, "sbn", 1); !slices.Equal(got, held) {
		t.Errorf("after the settle the row claim took %v, want the held %v", got, held)
	}
}
