package ops_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// blocked-keys shows each key held back by an earlier effect and why; a
// strict dead letter is stuck until it is replayed, and the replay moves it
// back to the head of its key (it is delivered before the waiting effects).
func TestCommandBlockedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 50, lastError: "boom"},
		eff{queue: "q", typ: "t", state: "available", availableAgo: 4000},
		eff{queue: "q", typ: "t", state: "available", availableAgo: 3000},
		eff{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 5},
		eff{queue: "q", typ: "t", state: "available", availableAgo: 200},
		eff{queue: "q", typ: "t", state: "available", availableAgo: 10}, // alone on its key: not blocked
		eff{queue: "q", typ: "t", state: "available", availableAgo: 10}, // no key
	)
	// seed writes no ordering key, and a key cannot be changed once
	// written: set them with the guard off (this test's own database).
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE pgoutbox.effects DISABLE TRIGGER effects_ordering_key_immutable`); err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{"rec-1", "rec-1", "rec-1", "rec-2", "rec-2", "rec-3"} {
		if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET ordering_key = $2 WHERE id = $1`, ids[i], k); err != nil {
			t.Fatal(err)
		}
	}
	before := b.fingerprint(t)
	var res ops.BlockedResult
	b.runJSON(t, nil, 0, &res, "blocked-keys")
	if len(res.Keys) != 2 || res.Stuck != 1 {
		t.Fatalf("blocked keys: %+v", res)
	}
	k := res.Keys[0]
	if k.OrderingKey != "rec-1" || k.HeadID != ids[0] || k.HeadState != "dead_letter" || !k.Stuck || k.Waiting != 2 ||
		k.HeadLastError != "boom" || res.Keys[1].OrderingKey != "rec-2" || res.Keys[1].HeadID != ids[3] ||
		res.Keys[1].Reason != "in delivery" || res.Keys[1].Stuck {
		t.Fatalf("blocked keys: %+v", res.Keys)
	}
	r := b.run(t, nil, "blocked-keys", "--stuck")
	if r.code != 0 || !regexp.MustCompile(`(?m)^QUEUE +ORDERING KEY +WAITING +OLDEST +HEAD ID +HEAD TYPE +HEAD +ATTEMPTS\nq +rec-1 +2 +\S+ +\d+ +t +dead letter \(strict\): replay it +8\n1 blocked key\(s\), 1 waiting for an operator$`).MatchString(r.stdout) {
		t.Fatalf("blocked-keys --stuck: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	columnsAligned(t, strings.SplitN(r.stdout, "\n1 blocked", 2)[0])
	// --check fails (3) only for the keys whose oldest waiting effect is
	// older than --max-blocked: rec-1's waited 4,000 s, rec-2's 200 s (far
	// apart, so a slow machine cannot move one across a threshold).
	if r := b.run(t, nil, "blocked-keys", "--check", "--max-blocked", "3h"); r.code != 0 {
		t.Fatalf("blocked-keys --check --max-blocked 3h: %d %s", r.code, r.stderr)
	}
	r = b.run(t, nil, "blocked-keys", "--check", "--max-blocked", "30m")
	if r.code != 3 || !strings.Contains(r.stderr, "1 key(s) blocked longer than 30m0s: q/rec-1 (") ||
		strings.Contains(r.stderr, "rec-2") || !strings.Contains(r.stdout, "rec-2") {
		t.Fatalf("blocked-keys --check --max-blocked 30m: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := b.run(t, nil, "blocked-keys", "--check", "--max-blocked", "10s", "--json"); r.code != 3 ||
		!strings.Contains(r.stderr, "2 key(s)") || !strings.HasPrefix(r.stdout, "{") {
		t.Fatalf("blocked-keys --check --max-blocked 10s --json: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := b.run(t, nil, "blocked-keys", "--check", "--max-blocked", "0s"); r.code != 1 ||
		!strings.Contains(r.stderr, "--max-blocked must be positive") || r.stdout != "" {
		t.Fatalf("blocked-keys --check --max-blocked 0s: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if b.fingerprint(t) != before {
		t.Fatal("blocked-keys changed the database")
	}
	// Replaying the dead letter unblocks the key: its head is now the
	// replayed effect, about to be delivered, not stuck.
	if r := b.run(t, nil, "dlq", "replay", "--id", itoa(ids[0])); r.code != 0 {
		t.Fatalf("replay: %d %s", r.code, r.stderr)
	}
	b.runJSON(t, nil, 0, &res, "blocked-keys", "--queue", "q")
	if len(res.Keys) != 2 || res.Stuck != 0 || res.Keys[0].HeadID != ids[0] || res.Keys[0].HeadState != "available" {
		t.Fatalf("after the replay: %+v", res)
	}
}
