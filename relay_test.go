package pgoutbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// relayOne claims the single available effect of queue "q" for a relay.
func relayOne(t *testing.T, b *bundle) *pgoutbox.Lease {
	t.Helper()
	ls, err := pgoutbox.ClaimRelay(b.ctx, b.pool, "q", "relay-1", 10, time.Minute)
	if err != nil || len(ls) != 1 {
		t.Fatalf("relay claim: %v (%d leases)", err, len(ls))
	}
	return ls[0]
}

func handoffOf(l *pgoutbox.Lease) pgoutbox.Handoff {
	return pgoutbox.Handoff{ID: l.ID, Type: l.Type, Key: l.Key, RelayToken: l.LeaseToken}
}

func takeOne(t *testing.T, b *bundle, h pgoutbox.Handoff, owner string) pgoutbox.TakeOverResult {
	t.Helper()
	res, err := pgoutbox.TakeOver(b.ctx, b.pool, []pgoutbox.Handoff{h}, owner, time.Minute)
	if err != nil || len(res) != 1 {
		t.Fatalf("take over: %v (%d results)", err, len(res))
	}
	return res[0]
}

func owner(t *testing.T, b *bundle, id int64) string {
	t.Helper()
	var o string
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(lease_owner, '') FROM pgoutbox.effects WHERE id = $1`, id).Scan(&o); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestRelayClaimHandOverTakeOverComplete(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "k"})
	l := relayOne(t, b)
	if l.Attempt != 0 {
		t.Fatalf("a relay claim counted attempt %d; publishing is not a delivery", l.Attempt)
	}
	if r := b.row(t, ids[0]); r.State != "leased" || r.Attempts != 0 {
		t.Fatalf("after relay claim: %+v", r)
	}
	done, err := pgoutbox.HandOver(b.ctx, b.pool, []*pgoutbox.Lease{l}, time.Hour)
	if err != nil || !done[ids[0]] {
		t.Fatalf("hand over: %v %v", err, done)
	}
	if o := owner(t, b, ids[0]); o != pgoutbox.HandoffOwner {
		t.Fatalf("owner after hand-over %q", o)
	}
	// The relay's token died with the hand-over.
	if err := l.Extend(b.ctx, b.pool, time.Minute); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("relay extend after hand-over: %v, want ErrLeaseLost", err)
	}
	// A message naming the right id but the wrong key is not this effect.
	wrong := handoffOf(l)
	wrong.Key = "other"
	if res := takeOne(t, b, wrong, "c1"); res.Action != pgoutbox.TakeOverMissing {
		t.Fatalf("wrong key: %+v", res)
	}
	res := takeOne(t, b, handoffOf(l), "c1")
	if res.Action != pgoutbox.TakenOver || res.Lease.Attempt != 1 || string(res.Lease.Payload) != "{}" {
		t.Fatalf("take over: %+v", res)
	}
	// The consumer holds a live lease: a second copy of the message waits.
	if again := takeOne(t, b, handoffOf(l), "c2"); again.Action != pgoutbox.TakeOverBusy || again.Wait < 50*time.Second {
		t.Fatalf("second take-over of a live lease: %+v", again)
	}
	if err := res.Lease.Complete(b.ctx, b.pool); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if r := b.row(t, ids[0]); r.State != "completed" || r.Attempts != 1 {
		t.Fatalf("after completion: %+v", r)
	}
	if again := takeOne(t, b, handoffOf(l), "c2"); again.Action != pgoutbox.TakeOverSettled || again.State != pgoutbox.StateCompleted {
		t.Fatalf("redelivered after completion: %+v", again)
	}
}

// A message can reach a consumer before the relay's hand-over commits: the
// relay's own token lets the consumer take over, and the late hand-over then
// changes nothing.
func TestTakeOverBeforeHandOverCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "k"})
	l := relayOne(t, b)
	res := takeOne(t, b, handoffOf(l), "c1")
	if res.Action != pgoutbox.TakenOver {
		t.Fatalf("take over by relay token: %+v", res)
	}
	before := b.rowJSON(t, ids[0])
	done, err := pgoutbox.HandOver(b.ctx, b.pool, []*pgoutbox.Lease{l}, time.Hour)
	if err != nil || done[ids[0]] {
		t.Fatalf("late hand-over: %v %v, want nothing handed over", err, done)
	}
	if after := b.rowJSON(t, ids[0]); after != before {
		t.Fatalf("late hand-over changed the row:\n%s\n%s", before, after)
	}
	// Another relay's claim of the same effect (after a crash) is not
	// accepted by token: its message names the first relay's token.
	stale := handoffOf(l)
	stale.RelayToken = "00000000-0000-0000-0000-000000000001"
	if r := takeOne(t, b, stale, "c2"); r.Action != pgoutbox.TakeOverBusy {
		t.Fatalf("stale token on a live consumer lease: %+v", r)
	}
}

func TestTakeOverAfterExpiredLeaseFollowsSweeperRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "safe"},
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "dispatch"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "last", MaxAttempts: 1},
	)
	ls, err := pgoutbox.ClaimRelay(b.ctx, b.pool, "q", "relay-1", 10, time.Minute)
	if err != nil || len(ls) != 3 {
		t.Fatal(err, len(ls))
	}
	var taken []*pgoutbox.Lease
	for _, l := range ls {
		res := takeOne(t, b, handoffOf(l), "dead-consumer")
		if res.Action != pgoutbox.TakenOver {
			t.Fatalf("%s: %+v", l.Key, res)
		}
		taken = append(taken, res.Lease)
	}
	if err := taken[1].MarkStarted(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	expire(t, b, ids...) // the consumer died mid-delivery
	results, err := pgoutbox.TakeOver(b.ctx, b.pool, []pgoutbox.Handoff{handoffOf(ls[0]), handoffOf(ls[1]), handoffOf(ls[2])}, "c2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if r := results[0]; r.Action != pgoutbox.TakenOver || r.Lease.Attempt != 2 {
		t.Fatalf("replay-safe after expiry: %+v", r)
	}
	if r := results[1]; r.Action != pgoutbox.TakeOverReconciled || r.State != pgoutbox.StateReconciliationRequired {
		t.Fatalf("started dispatch after expiry: %+v", r)
	}
	if r := b.row(t, ids[1]); r.State != "reconciliation_required" || r.Started == nil || r.LastError == nil {
		t.Fatalf("dispatch row: %+v", r)
	}
	if r := results[2]; r.Action != pgoutbox.TakeOverExhausted || r.State != pgoutbox.StateDeadLetter {
		t.Fatalf("exhausted after expiry: %+v", r)
	}
	// The dead consumer's fenced writes change nothing.
	for _, l := range taken {
		if err := l.Complete(b.ctx, b.pool); !errors.Is(err, pgoutbox.ErrLeaseLost) {
			t.Fatalf("the dead consumer's completion: %v, want ErrLeaseLost", err)
		}
	}
	if r := b.row(t, ids[0]); r.State != "leased" {
		t.Fatalf("the dead consumer completed a taken-over effect: %+v", r)
	}
}

func TestHandBackReleaseAndAvailableTakeOver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "k"})
	l := relayOne(t, b)
	if err := l.Release(b.ctx, b.pool, time.Hour, "broker unreachable"); err != nil {
		t.Fatal(err)
	}
	if r := b.row(t, ids[0]); r.State != "available" || r.Attempts != 0 || r.AvailableIn < 3000 || *r.LastError != "broker unreachable" {
		t.Fatalf("after release: %+v", r)
	}
	// A message for an effect that is not yet due waits.
	if r := takeOne(t, b, handoffOf(l), "c1"); r.Action != pgoutbox.TakeOverBusy || r.Wait < 3000*time.Second {
		t.Fatalf("not yet due: %+v", r)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET available_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	res := takeOne(t, b, handoffOf(l), "c1")
	if res.Action != pgoutbox.TakenOver || res.Lease.Attempt != 1 {
		t.Fatalf("take over an available effect: %+v", res)
	}
	if err := res.Lease.MarkStarted(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	if err := res.Lease.HandBack(b.ctx, b.pool, time.Hour, pgoutbox.Retry(errors.New("503"))); err != nil {
		t.Fatal(err)
	}
	r := b.row(t, ids[0])
	if r.State != "leased" || r.Started != nil || r.LastError == nil || owner(t, b, ids[0]) != pgoutbox.HandoffOwner {
		t.Fatalf("after hand-back: %+v", r)
	}
	if err := res.Lease.HandBack(b.ctx, b.pool, time.Hour, nil); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("second hand-back with a dead token: %v", err)
	}
	next := takeOne(t, b, handoffOf(l), "c2")
	if next.Action != pgoutbox.TakenOver || next.Lease.Attempt != 2 {
		t.Fatalf("take over after hand-back: %+v", next)
	}
}

func TestRetryHorizon(t *testing.T) {
	t.Parallel()
	// 8 attempts, backoff 2..256 s (+10 %), 60 s per attempt, +60 s.
	got := pgoutbox.RetryHorizon(8, 300*time.Second, time.Minute)
	want := 9*time.Minute + time.Duration(510*1.1*float64(time.Second))
	if got != want {
		t.Fatalf("RetryHorizon = %s, want %s", got, want)
	}
	if capped := pgoutbox.RetryHorizon(3, time.Second, 0); capped != time.Duration(3*1.1*float64(time.Second)) {
		t.Fatalf("capped horizon %s", capped)
	}
}
