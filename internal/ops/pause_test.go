package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// effect cancel completes what should never run (available: due, scheduled,
// retrying; a dead letter) with the cancellation as its resolution, and
// refuses, changing nothing, a leased effect, a reconciliation record, an
// effect whose delivery started, one already completed, and one a
// row-lock claim holds right now. A cancelled strict dead letter that
// heads its ordering key releases the key: its follower is claimable.
func TestCancelEffects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "q", typ: "t", state: "available", availableAgo: 10},                         // 0 due
		eff{queue: "q", typ: "t", state: "available", availableAgo: -3600},                      // 1 scheduled
		eff{queue: "q", typ: "t", state: "available", attempts: 2, availableAgo: -30},           // 2 retrying
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 5},           // 3 dead letter
		eff{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 1},                   // 4 in delivery
		eff{queue: "q", typ: "t", state: "reconciliation_required", attempts: 1, started: true}, // 5
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 1, started: true},             // 6 started
		eff{queue: "q", typ: "t", state: "completed", completedAgo: 5},                          // 7
		eff{queue: "o", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 50},          // 8 strict head of k
		eff{queue: "o", typ: "t", state: "available", availableAgo: 40},                         // 9 behind it
		eff{queue: "h", typ: "t", state: "available", availableAgo: 10},                         // 10 held by a claim
	)
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE pgoutbox.effects DISABLE TRIGGER effects_ordering_key_immutable`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET ordering_key = 'k' WHERE id = ANY($1)`, []int64{ids[8], ids[9]}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE pgoutbox.effects ENABLE TRIGGER effects_ordering_key_immutable`); err != nil {
		t.Fatal(err)
	}
	// Behind the strict dead letter, the follower is not claimable.
	claim := func(queue string) []store.Claimed {
		t.Helper()
		var cs []store.Claimed
		b.inTx(t, func(tx pgx.Tx) {
			var err error
			if cs, err = store.LockClaim(b.ctx, tx, queue, 10, time.Minute); err != nil {
				t.Fatal(err)
			}
		})
		return cs
	}
	if cs := claim("o"); len(cs) != 0 {
		t.Fatalf("the follower of a strict dead letter was claimable: %+v", cs)
	}
	// A row-lock claim holds effect 10 while the cancel runs.
	held, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Rollback(context.Background()) }()
	if cs, err := store.LockClaim(b.ctx, held, "h", 1, time.Minute); err != nil || len(cs) != 1 || cs[0].ID != ids[10] {
		t.Fatalf("row-lock claim: %+v %v", cs, err)
	}

	refused := []int64{ids[4], ids[5], ids[6], ids[7], ids[10], 999999}
	untouched := map[int64]string{}
	for _, id := range refused[:5] {
		untouched[id] = b.rowJSON(t, id)
	}
	dry, err := ops.CancelEffects(b.ctx, b.pool, ops.CancelOptions{IDs: ids, By: "alice", Reason: "bad data", DryRun: true})
	if err != nil || len(dry.Cancelled) != 6 || b.state(t, ids[0]) != "available" {
		t.Fatalf("dry run: %+v %v; state %s", dry, err, b.state(t, ids[0]))
	}
	res, err := ops.CancelEffects(b.ctx, b.pool, ops.CancelOptions{IDs: append(ids, 999999), By: "alice", Reason: "bad data"})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, m := range res.Cancelled {
		got = append(got, m.ID)
	}
	want := []int64{ids[0], ids[1], ids[2], ids[3], ids[8], ids[9]}
	if len(got) != len(want) {
		t.Fatalf("cancelled %v, want %v", got, want)
	}
	reasons := map[int64]string{}
	for _, s := range res.Skipped {
		reasons[s.ID] = s.State + ": " + s.Reason
	}
	for id, want := range map[int64]string{
		ids[4]: "leased: in delivery", ids[5]: "reconciliation_required: a reconciliation record",
		ids[6]: "dead_letter: its delivery started", ids[7]: "completed: already completed",
		ids[10]: "available: held by a delivery in progress", 999999: "missing: no such effect",
	} {
		if !strings.HasPrefix(reasons[id], want) {
			t.Errorf("effect %d: skipped as %q, want %q…", id, reasons[id], want)
		}
	}
	for id, before := range untouched {
		if after := b.rowJSON(t, id); after != before {
			t.Errorf("refused effect %d changed:\n%s\n%s", id, before, after)
		}
	}
	for _, id := range want {
		var by, reason, from string
		if err := b.pool.QueryRow(b.ctx, `SELECT resolution->>'by', resolution->>'reason', resolution->>'from_state'
			FROM pgoutbox.effects WHERE id = $1 AND state = 'completed' AND (resolution->>'cancelled')::boolean`, id).Scan(&by, &reason, &from); err != nil {
			t.Fatalf("effect %d not cancelled: %v", id, err)
		}
		if by != "alice" || reason != "bad data" {
			t.Errorf("effect %d: resolution by %q reason %q", id, by, reason)
		}
	}
	// The key moved on: its head was cancelled. (Effect 9 was cancelled
	// too; a fresh follower shows the key is free.)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key)
		VALUES ('o', 't', 'after', 'k')`); err != nil {
		t.Fatal(err)
	}
	if cs := claim("o"); len(cs) != 1 {
		t.Fatalf("after cancelling the head, the key's next effect is not claimable: %+v", cs)
	}
	// Input bounds: refused before any statement.
	for _, o := range []ops.CancelOptions{{By: "a"}, {IDs: []int64{1}}, {IDs: []int64{1}, By: "a", Reason: strings.Repeat("x", 501)}} {
		if _, err := ops.CancelEffects(b.ctx, b.pool, o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

// queue pause, paused and resume through the binary: the pause is shown by
// status and pgoutbox_queue_paused is its gauge; resuming a queue that is
// not paused exits 1 and changes nothing.
func TestCommandQueuePause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool, eff{queue: "emails", typ: "t", state: "available", availableAgo: 5})
	if r := b.run(t, nil, "queue", "pause", "emails", "--by", "bob", "--reason", "smtp down"); r.code != 0 ||
		!strings.Contains(r.stdout, "paused queue emails") {
		t.Fatalf("pause: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := b.run(t, nil, "queue", "pause", "emails"); r.code != 0 || !strings.Contains(r.stdout, "already paused") {
		t.Fatalf("second pause: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := b.run(t, nil, "status"); !strings.Contains(r.stdout, "PAUSED emails since ") || !strings.Contains(r.stdout, "by bob: smtp down") {
		t.Fatalf("status does not show the pause:\n%s", r.stdout)
	}
	if r := b.run(t, nil, "queue", "paused"); !strings.Contains(r.stdout, "emails") || !strings.Contains(r.stdout, "smtp down") {
		t.Fatalf("queue paused:\n%s", r.stdout)
	}
	if r := b.run(t, nil, "queue", "resume", "emails"); r.code != 0 || !strings.Contains(r.stdout, "resumed queue emails") {
		t.Fatalf("resume: %d %s %s", r.code, r.stdout, r.stderr)
	}
	before := b.fingerprint(t)
	if r := b.run(t, nil, "queue", "resume", "emails"); r.code != 1 || !strings.Contains(r.stderr, "not paused") {
		t.Fatalf("resume of a running queue: %d %s", r.code, r.stderr)
	}
	if r := b.run(t, nil, "queue", "pause", strings.Repeat("q", 129)); r.code != 1 {
		t.Fatalf("pause of a 129-byte name: %d %s", r.code, r.stderr)
	}
	if b.fingerprint(t) != before {
		t.Fatal("a refused pause or resume changed the database")
	}
}
