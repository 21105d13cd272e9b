package store

import (
	"context"
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
