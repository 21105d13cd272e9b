package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// parkState reads whether effect id is parked and whether it is in the
// claim's range (available_at <= now()).
func parkState(ctx context.Context, t *testing.T, pool *pgxpool.Pool, id int64) (parked, inRange bool) {
	t.Helper()
	err := pool.QueryRow(ctx, `SELECT parked_due_at IS NOT NULL, available_at <= now() FROM pgoutbox.effects WHERE id = $1`, id).
		Scan(&parked, &inRange)
	if err != nil {
		t.Fatal(err)
	}
	return parked, inRange
}

// parkedStat is what the aggregate statistics (status, /metrics) count as
// parked in queue, over its per-type rows.
func parkedStat(ctx context.Context, t *testing.T, pool *pgxpool.Pool, queue string) int64 {
	t.Helper()
	rows, err := Stats(ctx, pool, OpsFilter{Queue: queue}, time.Hour, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, r := range rows {
		if !r.QueueTotal {
			n += r.Parked
		}
	}
	return n
}

func insertOrdered(ctx context.Context, t *testing.T, pool *pgxpool.Pool, queue, key string, n int) []int64 {
	t.Helper()
	var ids []int64
	for i := range n {
		got, err := Insert(ctx, pool, []NewEffect{{Queue: queue, Type: "t", Key: key + "-" + string(rune('a'+i)), Payload: []byte(`{}`), MaxAttempts: 5, OrderingKey: key}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got[0].ID)
	}
	return ids
}

// Park hides the followers of a blocked key from the claim's range and
// keeps the head; completing the head un-parks exactly the next effect
// (the trigger), which then is claimed; the rest stay parked.
func TestParkAndUnparkOnCompletion(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 3)
	if _, err := Insert(ctx, pool, []NewEffect{{Queue: "q", Type: "t", Key: "u", Payload: []byte(`{}`), MaxAttempts: 5}}); err != nil {
		t.Fatal(err)
	}
	n, err := Park(ctx, pool, "", 1, 1000)
	if err != nil || n != 2 {
		t.Fatalf("Park = %d, %v; want 2 (the two followers)", n, err)
	}
	if p, _ := parkState(ctx, t, pool, ids[0]); p {
		t.Fatal("the head was parked")
	}
	if n := parkedStat(ctx, t, pool, "q"); n != 2 {
		t.Fatalf("statistics count %d parked, want 2", n)
	}
	for _, id := range ids[1:] {
		if p, r := parkState(ctx, t, pool, id); !p || r {
			t.Fatalf("follower %d: parked %v, in the claim range %v", id, p, r)
		}
	}
	c, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(c) != 2 {
		t.Fatalf("claim = %d effects, %v; want the head and the unordered one", len(c), err)
	}
	var head Claimed
	for _, x := range c {
		if x.ID == ids[0] {
			head = x
		}
	}
	if head.ID == 0 {
		t.Fatalf("the head %d was not claimed: %+v", ids[0], c)
	}
	if done, err := Complete(ctx, pool, []Fence{{ID: head.ID, Token: head.Token, Type: head.Type}}); err != nil || len(done) != 1 {
		t.Fatalf("complete = %v, %v", done, err)
	}
	if p, r := parkState(ctx, t, pool, ids[1]); p || !r {
		t.Fatalf("after the head completed, effect %d: parked %v, in the claim range %v", ids[1], p, r)
	}
	if p, _ := parkState(ctx, t, pool, ids[2]); !p {
		t.Fatal("the third effect was un-parked while the second still blocks it")
	}
	if n := parkedStat(ctx, t, pool, "q"); n != 1 {
		t.Fatalf("after the head completed, statistics count %d parked, want 1", n)
	}
	c, err = Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(c) != 1 || c[0].ID != ids[1] {
		t.Fatalf("claim = %+v, %v; want effect %d", c, err, ids[1])
	}
}

// The sweeper's safety net: a row parked with no blocking predecessor (a
// missed un-park, made here by hand) is un-parked with its due time back
// by one Unpark, and then claimed; a row with a blocker stays parked.
func TestUnparkSafetyNet(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 2)
	var due time.Time
	if err := pool.QueryRow(ctx, `UPDATE pgoutbox.effects SET parked_due_at = available_at, available_at = 'infinity'
		WHERE id = ANY($1) RETURNING parked_due_at`, ids).Scan(&due); err != nil {
		t.Fatal(err)
	}
	if c, err := Claim(ctx, pool, "q", "w", 10, time.Minute); err != nil || len(c) != 0 {
		t.Fatalf("claim of parked effects = %+v, %v; want none", c, err)
	}
	qs, err := Unpark(ctx, pool, 1000)
	if err != nil || len(qs) != 1 || qs[0] != "q" {
		t.Fatalf("Unpark = %v, %v; want the head of queue q only", qs, err)
	}
	var back time.Time
	if err := pool.QueryRow(ctx, `SELECT available_at FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&back); err != nil {
		t.Fatal(err)
	}
	if !back.Equal(due) {
		t.Fatalf("un-parked available_at = %v, want its due time %v", back, due)
	}
	if p, _ := parkState(ctx, t, pool, ids[1]); !p {
		t.Fatal("the follower, still blocked by the head, was un-parked")
	}
	c, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(c) != 1 || c[0].ID != ids[0] {
		t.Fatalf("claim = %+v, %v; want effect %d", c, err, ids[0])
	}
}

// NextDue does not report a parked effect as due at infinity.
func TestNextDueIgnoresParked(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 2)
	if n, err := Park(ctx, pool, "q", 1, 10); err != nil || n != 1 {
		t.Fatalf("Park = %d, %v", n, err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET available_at = now() + interval '1 hour' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	d, ok, err := NextDue(ctx, pool, "q")
	if err != nil || !ok || d > time.Hour || d < 59*time.Minute {
		t.Fatalf("NextDue = %v, %v, %v; want the head's hour", d, ok, err)
	}
}

// waitLockWait returns once the backend pid waits for a lock, or done is
// closed (it never waited).
func waitLockWait(ctx context.Context, t *testing.T, pool *pgxpool.Pool, pid int32, done <-chan struct{}) {
	t.Helper()
	for {
		select {
		case <-done:
			return
		default:
		}
		var waiting bool
		if err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).
			Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
	}
}

// The race of a park with the completion of the blocker it saw: the parker
// holds a share lock on the blocker, so the completion waits for the
// parker's commit and its un-park trigger then sees the parked row. Without
// that lock the trigger runs before the park is visible and the follower
// stays parked behind nothing.
func TestParkRacesCompletion(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 2)
	c, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	parker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer parker.Rollback(ctx)
	if n, err := Park(ctx, parker, "q", 1, 10); err != nil || n != 1 {
		t.Fatalf("Park = %d, %v", n, err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	pid, err := BackendPID(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var completeErr error
	go func() {
		defer close(done)
		_, completeErr = Complete(ctx, conn, []Fence{c[0].Fence()})
	}()
	waitLockWait(ctx, t, pool, pid, done)
	if err := parker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if completeErr != nil {
		t.Fatal(completeErr)
	}
	if p, r := parkState(ctx, t, pool, ids[1]); p || !r {
		t.Fatalf("after the race, the new head %d: parked %v, in the claim range %v", ids[1], p, r)
	}
}

// The other order: the blocker is being completed (its row locked) when
// the parker runs. The parker skips it instead of waiting and, with no
// other blocker, parks nothing.
func TestParkSkipsBlockerBeingChanged(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 2)
	c, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(c) != 1 {
		t.Fatalf("claim = %+v, %v", c, err)
	}
	completer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer completer.Rollback(ctx)
	if done, err := Complete(ctx, completer, []Fence{c[0].Fence()}); err != nil || len(done) != 1 {
		t.Fatalf("complete = %v, %v", done, err)
	}
	// A parker that waited for the completer would fail here, not hang.
	parker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer parker.Rollback(ctx)
	if _, err := parker.Exec(ctx, `SET LOCAL lock_timeout = '10s'`); err != nil {
		t.Fatal(err)
	}
	if n, err := Park(ctx, parker, "q", 1, 10); err != nil || n != 0 {
		t.Fatalf("Park = %d, %v; want 0 without waiting", n, err)
	}
	if err := parker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := completer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if p, r := parkState(ctx, t, pool, ids[1]); p || !r {
		t.Fatalf("effect %d: parked %v, in the claim range %v", ids[1], p, r)
	}
}

// Park leaves a key's first waiting effects in the claim's range: with
// behind 3, only the effect with three earlier ones is parked. A bad
// threshold is refused and parks nothing.
func TestParkBehindThreshold(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ids := insertOrdered(ctx, t, pool, "q", "k", 4)
	if n, err := Park(ctx, pool, "q", 0, 10); err == nil || n != 0 {
		t.Fatalf("Park(behind 0) = %d, %v; want an error", n, err)
	}
	if n, err := Park(ctx, pool, "q", 3, 10); err != nil || n != 1 {
		t.Fatalf("Park(behind 3) = %d, %v; want 1", n, err)
	}
	for i, id := range ids {
		if p, _ := parkState(ctx, t, pool, id); p != (i == 3) {
			t.Fatalf("effect %d (position %d): parked %v", id, i, p)
		}
	}
}

// claimWalked runs the claim of one effect of queue under EXPLAIN ANALYZE
// (in a transaction it rolls back) and returns the rows the claim index
// scan yielded and then filtered out: the ordered effects the claim probed
// and found blocked before it reached a claimable one.
func claimWalked(ctx context.Context, t testing.TB, pool *pgxpool.Pool, queue string) (walked int64, claimed int64) {
	t.Helper()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+claimSQL, queue, 1, "w", 60.0, 1).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if n["Index Name"] == "effects_claim_idx" {
			if v, ok := n["Rows Removed by Filter"].(float64); ok {
				walked += int64(v)
			}
		}
		if n["Node Type"] == "ModifyTable" {
			claimed = int64(n["Actual Rows"].(float64))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	return walked, claimed
}

// The followers of a key whose head waits for an operator (a strict dead
// letter, a reconciliation record) are parked however few they are, so a
// claim of an unordered effect enqueued after them probes none of them;
// the followers of a head that is only retrying keep the threshold.
func TestParkBehindStuckHeadIgnoresThreshold(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const keys, followers = 40, 5
	var stuck, retrying []int64
	for k := range keys {
		ids := insertOrdered(ctx, t, pool, "q", fmt.Sprintf("k%02d", k), 1+followers)
		state := "dead_letter"
		if k%2 == 1 {
			state = "reconciliation_required"
		}
		if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = $2::pgoutbox.effect_state WHERE id = $1`, ids[0], state); err != nil {
			t.Fatal(err)
		}
		stuck = append(stuck, ids[1:]...)
	}
	// A head in its backoff: its followers wait, but not for an operator.
	ids := insertOrdered(ctx, t, pool, "q", "retrying", 1+followers)
	if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET attempts = 1, available_at = now() + interval '1 hour' WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	retrying = ids[1:]
	free, err := Insert(ctx, pool, []NewEffect{{Queue: "q", Type: "t", Key: "free", Payload: []byte(`{}`), MaxAttempts: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if walked, _ := claimWalked(ctx, t, pool, "q"); walked != int64(len(stuck)+len(retrying)) {
		t.Fatalf("before parking the claim walked %d blocked effects, want %d", walked, len(stuck)+len(retrying))
	}
	n, err := Park(ctx, pool, "", ParkBehindDefault, 1000)
	if err != nil || n != int64(len(stuck)) {
		t.Fatalf("Park = %d, %v; want the %d followers of the stuck heads", n, err, len(stuck))
	}
	for _, id := range stuck {
		if p, r := parkState(ctx, t, pool, id); !p || r {
			t.Fatalf("follower %d of a stuck head: parked %v, in the claim range %v", id, p, r)
		}
	}
	for _, id := range retrying {
		if p, _ := parkState(ctx, t, pool, id); p {
			t.Fatalf("follower %d of a retrying head (%d earlier) was parked", id, ParkBehindDefault)
		}
	}
	if walked, claimed := claimWalked(ctx, t, pool, "q"); walked != int64(len(retrying)) || claimed != 1 {
		t.Fatalf("after parking the claim walked %d blocked effects and claimed %d; want %d (the retrying key's) and 1",
			walked, claimed, len(retrying))
	}
	c, err := Claim(ctx, pool, "q", "w", 1, time.Minute)
	if err != nil || len(c) != 1 || c[0].ID != free[0].ID {
		t.Fatalf("claim = %+v, %v; want the unordered effect %d", c, err, free[0].ID)
	}
}

// Park's limit counts only effects it can park: a batch's worth of ordered
// effects that are not blocked (each behind a move-on dead letter only)
// ranked before a blocked one does not keep it from being parked.
func TestParkLimitCountsBlockedOnly(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := SetOrderingChoices(ctx, pool, []string{"q"}, []string{"t"}, []bool{true}); err != nil {
		t.Fatal(err)
	}
	const limit = 10
	for k := range limit {
		ids := insertOrdered(ctx, t, pool, "q", fmt.Sprintf("a%02d", k), 2)
		if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = 'dead_letter' WHERE id = $1`, ids[0]); err != nil {
			t.Fatal(err)
		}
	}
	ids := insertOrdered(ctx, t, pool, "q", "z", 2)
	n, err := Park(ctx, pool, "q", 1, limit)
	if err != nil || n != 1 {
		t.Fatalf("Park(limit %d) = %d, %v; want 1 (the blocked follower of key z)", limit, n, err)
	}
	if p, _ := parkState(ctx, t, pool, ids[1]); !p {
		t.Fatalf("the blocked follower %d was not parked", ids[1])
	}
}
