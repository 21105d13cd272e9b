package handoff_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

// relayOne claims the single available effect of queue "q" for a relay.
func relayOne(t *testing.T, b *bundle) *handoff.Lease {
	t.Helper()
	ls, err := handoff.ClaimRelay(b.ctx, b.pool, "q", "relay-1", 10, time.Minute)
	if err != nil || len(ls) != 1 {
		t.Fatalf("relay claim: %v (%d leases)", err, len(ls))
	}
	return ls[0]
}

func messageOf(l *handoff.Lease) handoff.Message {
	return handoff.Message{ID: l.ID, Type: l.Type, Key: l.Key, RelayToken: l.LeaseToken}
}

func takeOne(t *testing.T, b *bundle, h handoff.Message, owner string) handoff.Result {
	t.Helper()
	res, err := handoff.TakeOver(b.ctx, b.pool, []handoff.Message{h}, owner, time.Minute)
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
	done, err := handoff.HandOver(b.ctx, b.pool, []*handoff.Lease{l}, time.Hour)
	if err != nil || !done[ids[0]] {
		t.Fatalf("hand over: %v %v", err, done)
	}
	if o := owner(t, b, ids[0]); o != handoff.Owner {
		t.Fatalf("owner after hand-over %q", o)
	}
	// The relay's token died with the hand-over.
	if err := extend(b, l, time.Minute); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("relay extend after hand-over: %v, want ErrLeaseLost", err)
	}
	// A message naming the right id but the wrong key is not this effect.
	wrong := messageOf(l)
	wrong.Key = "other"
	if res := takeOne(t, b, wrong, "c1"); res.Action != handoff.Missing {
		t.Fatalf("wrong key: %+v", res)
	}
	res := takeOne(t, b, messageOf(l), "c1")
	if res.Action != handoff.Taken || res.Lease.Attempt != 1 || string(res.Lease.Payload) != "{}" {
		t.Fatalf("take over: %+v", res)
	}
	// The consumer holds a live lease: a second copy of the message waits.
	if again := takeOne(t, b, messageOf(l), "c2"); again.Action != handoff.Busy || again.Wait < 50*time.Second {
		t.Fatalf("second take-over of a live lease: %+v", again)
	}
	if err := complete(b, res.Lease); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if r := b.row(t, ids[0]); r.State != "completed" || r.Attempts != 1 {
		t.Fatalf("after completion: %+v", r)
	}
	if again := takeOne(t, b, messageOf(l), "c2"); again.Action != handoff.Settled || again.State != pgoutbox.StateCompleted {
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
	res := takeOne(t, b, messageOf(l), "c1")
	if res.Action != handoff.Taken {
		t.Fatalf("take over by relay token: %+v", res)
	}
	before := b.rowJSON(t, ids[0])
	done, err := handoff.HandOver(b.ctx, b.pool, []*handoff.Lease{l}, time.Hour)
	if err != nil || done[ids[0]] {
		t.Fatalf("late hand-over: %v %v, want nothing handed over", err, done)
	}
	if after := b.rowJSON(t, ids[0]); after != before {
		t.Fatalf("late hand-over changed the row:\n%s\n%s", before, after)
	}
	// Another relay's claim of the same effect (after a crash) is not
	// accepted by token: its message names the first relay's token.
	stale := messageOf(l)
	stale.RelayToken = "00000000-0000-0000-0000-000000000001"
	if r := takeOne(t, b, stale, "c2"); r.Action != handoff.Busy {
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
	ls, err := handoff.ClaimRelay(b.ctx, b.pool, "q", "relay-1", 10, time.Minute)
	if err != nil || len(ls) != 3 {
		t.Fatal(err, len(ls))
	}
	var taken []*handoff.Lease
	for _, l := range ls {
		res := takeOne(t, b, messageOf(l), "dead-consumer")
		if res.Action != handoff.Taken {
			t.Fatalf("%s: %+v", l.Key, res)
		}
		taken = append(taken, res.Lease)
	}
	if err := markStarted(b, taken[1]); err != nil {
		t.Fatal(err)
	}
	expire(t, b, ids...) // the consumer died mid-delivery
	results, err := handoff.TakeOver(b.ctx, b.pool, []handoff.Message{messageOf(ls[0]), messageOf(ls[1]), messageOf(ls[2])}, "c2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if r := results[0]; r.Action != handoff.Taken || r.Lease.Attempt != 2 {
		t.Fatalf("replay-safe after expiry: %+v", r)
	}
	if r := results[1]; r.Action != handoff.Reconciled || r.State != pgoutbox.StateReconciliationRequired {
		t.Fatalf("started dispatch after expiry: %+v", r)
	}
	if r := b.row(t, ids[1]); r.State != "reconciliation_required" || r.Started == nil || r.LastError == nil {
		t.Fatalf("dispatch row: %+v", r)
	}
	if r := results[2]; r.Action != handoff.Exhausted || r.State != pgoutbox.StateDeadLetter {
		t.Fatalf("exhausted after expiry: %+v", r)
	}
	// The dead consumer's fenced writes change nothing.
	for _, l := range taken {
		if err := complete(b, l); !errors.Is(err, pgoutbox.ErrLeaseLost) {
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
	if r := takeOne(t, b, messageOf(l), "c1"); r.Action != handoff.Busy || r.Wait < 3000*time.Second {
		t.Fatalf("not yet due: %+v", r)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET available_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	res := takeOne(t, b, messageOf(l), "c1")
	if res.Action != handoff.Taken || res.Lease.Attempt != 1 {
		t.Fatalf("take over an available effect: %+v", res)
	}
	if err := markStarted(b, res.Lease); err != nil {
		t.Fatal(err)
	}
	if err := handoff.HandBack(b.ctx, b.pool, res.Lease, time.Hour, pgoutbox.Retry(errors.New("503"))); err != nil {
		t.Fatal(err)
	}
	r := b.row(t, ids[0])
	if r.State != "leased" || r.Started != nil || r.LastError == nil || owner(t, b, ids[0]) != handoff.Owner {
		t.Fatalf("after hand-back: %+v", r)
	}
	if err := handoff.HandBack(b.ctx, b.pool, res.Lease, time.Hour, nil); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("second hand-back with a dead token: %v", err)
	}
	next := takeOne(t, b, messageOf(l), "c2")
	if next.Action != handoff.Taken || next.Lease.Attempt != 2 {
		t.Fatalf("take over after hand-back: %+v", next)
	}
}

func TestRetryHorizon(t *testing.T) {
	t.Parallel()
	// 8 attempts, backoff 2..256 s (+10 %), 60 s per attempt, +60 s.
	got := handoff.RetryHorizon(8, 300*time.Second, time.Minute)
	want := 9*time.Minute + time.Duration(510*1.1*float64(time.Second))
	if got != want {
		t.Fatalf("RetryHorizon = %s, want %s", got, want)
	}
	if capped := handoff.RetryHorizon(3, time.Second, 0); capped != time.Duration(3*1.1*float64(time.Second)) {
		t.Fatalf("capped horizon %s", capped)
	}
}

// A relay dead-letters what the broker can never take, without counting a
// delivery; the write is fenced like every other.
func TestDeadLetterIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "safe", Key: "k"})
	l := relayOne(t, b)
	if err := l.DeadLetter(b.ctx, b.pool, pgoutbox.Permanent(errors.New("relay: payload too large"))); err != nil {
		t.Fatal(err)
	}
	r := b.row(t, ids[0])
	if r.State != "dead_letter" || r.Attempts != 0 || r.LastError == nil || *r.LastError != "relay: payload too large (permanent)" {
		t.Fatalf("after dead letter: %+v (last_error %v)", r, r.LastError)
	}
	before := b.rowJSON(t, ids[0])
	if err := l.DeadLetter(b.ctx, b.pool, errors.New("again")); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("second dead letter: %v, want ErrLeaseLost", err)
	}
	if err := l.Release(b.ctx, b.pool, 0, "again"); !errors.Is(err, pgoutbox.ErrLeaseLost) {
		t.Fatalf("release after dead letter: %v, want ErrLeaseLost", err)
	}
	if after := b.rowJSON(t, ids[0]); after != before {
		t.Fatalf("a dead lease changed the row:\n%s\n%s", before, after)
	}
}
