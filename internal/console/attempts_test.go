package console_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// TestAttemptHistory drives one effect through the engine's statements —
// two failed deliveries with the same error, a broker hand-over, a
// consumer's hand-back, a permanent failure, a replay and a success — and
// checks pgoutbox.effect_attempts (migration 00012) holds exactly one row
// per failure and one for the replay, none for a claim, a hand-over or the
// completion; that the effect page's timeline shows each error, redacted;
// and that deleting the effect deletes its history and no other.
func TestAttemptHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "", false)
	ctx := e.ctx
	var id, otherID int64
	if err := e.pool.QueryRow(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, max_attempts)
		VALUES ('hist', 'hist.effect', 'k1', 5) RETURNING id`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	e.exec(t, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('hist2', 'hist.effect', 'k2')`)
	if err := e.pool.QueryRow(ctx, `SELECT id FROM pgoutbox.effects WHERE queue = 'hist2'`).Scan(&otherID); err != nil {
		t.Fatal(err)
	}
	claim := func(owner string) store.Fence {
		t.Helper()
		cs, err := store.Claim(ctx, e.pool, "hist", owner, 1, time.Minute)
		if err != nil || len(cs) != 1 {
			t.Fatalf("claim by %s: %v %v", owner, cs, err)
		}
		return cs[0].Fence()
	}
	fail := func(f store.Fence, kind store.FailKind, msg, want string) {
		t.Helper()
		st, found, err := store.Fail(ctx, e.pool, f, kind, 0, msg)
		if err != nil || !found || st != want {
			t.Fatalf("fail: %s %v %v, want %s", st, found, err, want)
		}
	}
	rows := func() int {
		return e.count(t, `SELECT count(*) FROM pgoutbox.effect_attempts WHERE effect_id = $1`, id)
	}

	const leaky = "solr: HTTP 503 from http://indexer:p4ssw0rd@solr:8983/solr?api_key=k3y-v4lue"
	fail(claim("worker-a"), store.FailRetry, leaky, "available")
	fail(claim("worker-b"), store.FailRetry, leaky, "available") // the same text again: still a row
	if n := rows(); n != 2 {
		t.Fatalf("after two failures: %d history rows, want 2", n)
	}

	// Broker path: the relay's claim and hand-over are not failures (the
	// row carries the last error throughout); the consumer's hand-back is.
	rc, err := store.ClaimRelay(ctx, e.pool, "hist", "relay-1", 1, time.Minute)
	if err != nil || len(rc) != 1 {
		t.Fatalf("relay claim: %v %v", rc, err)
	}
	if done, err := store.HandOver(ctx, e.pool, []store.Fence{{ID: id, Token: rc[0].Token, Type: "hist.effect"}}, "handoff", time.Minute); err != nil || !done[id] {
		t.Fatalf("hand-over: %v %v", done, err)
	}
	take := func(consumer string) store.Fence {
		t.Helper()
		res, err := store.TakeOver(ctx, e.pool, []store.TakeOverReq{{ID: id, Type: "hist.effect", Key: "k1"}}, "handoff", consumer, time.Minute)
		if err != nil || len(res) != 1 || res[0].Action != store.TakeTaken {
			t.Fatalf("take-over by %s: %+v %v", consumer, res, err)
		}
		return store.Fence{ID: id, Token: res[0].Claimed.Token, Type: "hist.effect"}
	}
	if found, err := store.HandBack(ctx, e.pool, take("consumer-1"), "handoff", time.Minute, "consumer: HTTP 502"); err != nil || !found {
		t.Fatalf("hand-back: %v %v", found, err)
	}
	if n := rows(); n != 3 {
		t.Fatalf("after the hand-over and a hand-back: %d history rows, want 3", n)
	}
	fail(take("consumer-2"), store.FailDeadLetter, "permanent: HTTP 400 Authorization: Bearer abcdef123456", "dead_letter")
	if moved, err := store.ReplayDeadLetters(ctx, e.pool, []int64{id}, store.OpsFilter{}, 1); err != nil || len(moved) != 1 {
		t.Fatalf("replay: %v %v", moved, err)
	}
	if done, err := store.Complete(ctx, e.pool, []store.Fence{claim("worker-c")}); err != nil || len(done) != 1 {
		t.Fatalf("complete: %v %v", done, err)
	}
	type row struct {
		attempt         int
		outcome, worker string
		hasError        bool
	}
	var got []row
	rs, err := e.pool.Query(ctx, `SELECT attempt, outcome, coalesce(worker, ''), error IS NOT NULL
		FROM pgoutbox.effect_attempts WHERE effect_id = $1 ORDER BY seq`, id)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.attempt, &r.outcome, &r.worker, &r.hasError); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	want := []row{
		{1, "retrying", "worker-a", true},
		{2, "retrying", "worker-b", true},
		{3, "retrying", "consumer-1", true},
		{4, "dead_letter", "consumer-2", true},
		{4, "replayed", "", false},
	}
	if len(got) != len(want) {
		t.Fatalf("history %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("history row %d: %+v, want %+v (all: %+v)", i, got[i], want[i], got)
		}
	}

	// The page shows every error, redacted, and the replay.
	a := do(t, e.client(t), "GET", e.srv.URL+"/console/effects/"+strconv.FormatInt(id, 10), nil)
	if a.code != http.StatusOK {
		t.Fatalf("effect page: %d", a.code)
	}
	for _, s := range []string{"attempt 1 failed → retrying", "attempt 2 failed → retrying", "consumer: HTTP 502",
		"attempt 4 failed → dead_letter", "replayed by an operator after 4 attempt(s)", "worker-b", "completed"} {
		if !strings.Contains(a.body, s) {
			t.Errorf("effect page lacks %q", s)
		}
	}
	if n := strings.Count(a.body, "solr: HTTP 503"); n != 2 {
		t.Errorf("effect page shows the 503 %d times, want 2 (one per attempt)", n)
	}
	for _, leak := range []string{"p4ssw0rd", "k3y-v4lue", "abcdef123456"} {
		if strings.Contains(a.body, leak) {
			t.Errorf("effect page shows %q", leak)
		}
	}

	// Deleting the effect deletes its history, and only its.
	e.exec(t, `INSERT INTO pgoutbox.effect_attempts (effect_id, attempt, outcome, error) VALUES ($1, 1, 'retrying', 'x')`, otherID)
	e.exec(t, `DELETE FROM pgoutbox.effects WHERE id = $1`, id)
	if n, other := rows(), e.count(t, `SELECT count(*) FROM pgoutbox.effect_attempts WHERE effect_id = $1`, otherID); n != 0 || other != 1 {
		t.Fatalf("after deleting the effect: %d of its history rows left (want 0), %d of the other's (want 1)", n, other)
	}
}

func TestRedactError(t *testing.T) {
	for in, want := range map[string]string{
		"GET https://u:secret@h/x: 401":                  "GET https://[redacted]@h/x: 401",
		"dial: dsn host=db password=hunter2 x=1":         "dial: dsn host=db password=[redacted] x=1",
		`body {"access_token": "abc", "user": "a"}`:      `body {"access_token": "[redacted]", "user": "a"}`,
		"Authorization: Bearer abcdef123456":             "Authorization: Bearer [redacted]",
		"solr: update: HTTP 401: require authentication": "solr: update: HTTP 401: require authentication",
		"author=ann keyword=x":                           "author=ann keyword=x",
	} {
		if got := console.RedactError(in); got != want {
			t.Errorf("RedactError(%q) = %q, want %q", in, got, want)
		}
	}
}
