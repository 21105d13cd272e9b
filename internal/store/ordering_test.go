package store

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// preOrderingClaimSQL is the claim as it was before migration 00013, with
// the pause check of migration 00023 (one probe per statement, not per row).
const preOrderingClaimSQL = `WITH next AS (SELECT id
    FROM pgoutbox.effects e
    WHERE state = 'available' AND queue = $1 AND available_at <= now()
      AND ` + notPausedSQL + `
    ORDER BY available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED)` + leaseSQL

// planShape keeps a plan's nodes and index names, dropping costs, filters
// and the head-of-line subplan (which runs only for ordered rows).
func planShape(p string) string {
	costs := regexp.MustCompile(`\s+\(cost=.*\)$`)
	numbers := regexp.MustCompile(`\d+`)
	var out []string
	skipDepth := -1
	for _, line := range strings.Split(p, "\n") {
		depth := indent(line)
		trim := strings.TrimSpace(line)
		if skipDepth >= 0 && depth > skipDepth {
			continue
		}
		skipDepth = -1
		if strings.HasPrefix(trim, "SubPlan") {
			skipDepth = depth
			continue
		}
		if trim == "" || strings.HasPrefix(trim, "Filter:") || strings.HasPrefix(trim, "Index Cond:") ||
			strings.HasPrefix(trim, "Recheck Cond:") {
			continue
		}
		// Plan numbering ($n, InitPlan n) shifts with the subplans.
		out = append(out, numbers.ReplaceAllString(costs.ReplaceAllString(line, ""), "N"))
	}
	return strings.Join(out, "\n")
}

// indent is how many spaces an EXPLAIN line starts with: its depth.
func indent(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }

// streamFloor returns the lines of an EXPLAIN's InitPlan of the claim's
// stream floor (notBehindStreamSQL, pgoutbox.stream_floor) and the plan
// without them: a subquery of the queue alone, run at most once per claim,
// and only for an ordered candidate.
func streamFloor(plan string) (floor []string, rest string) {
	lines := strings.Split(plan, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(strings.TrimSpace(line), "InitPlan") {
			continue
		}
		depth, end := indent(line), i+1
		for end < len(lines) && indent(lines[end]) > depth {
			end++
		}
		if block := lines[i:end]; strings.Contains(strings.Join(block, "\n"), " on queue_storage qs") {
			return block, strings.Join(append(lines[:i:i], lines[end:]...), "\n")
		}
	}
	return nil, plan
}

// A queue without ordered effects is claimed with the plan it had before
// ordering existed: the claim index in (available_at, id) order, the
// head-of-line check a filter never evaluated for its rows. An ordered queue
// checks each candidate with one probe of effects_ordering_idx (an earlier
// effect blocks) and one of effects_ordered_leases_idx (a later one is
// leased).
func TestClaimPlanUnchangedWithoutOrderedEffects(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, sql := range []string{
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key)
		 SELECT 'q', 't', g::text FROM generate_series(1, 20000) g`,
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key)
		 SELECT 'o', 't', g::text, (g % 100)::text FROM generate_series(1, 20000) g`,
		`ANALYZE pgoutbox.effects`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	args := []any{"q", 10, "w", 60.0, 1}
	before := planShape(explain(ctx, t, pool, "pre-ordering claim", preOrderingClaimSQL, args...))
	after := explain(ctx, t, pool, "claim", claimSQL, args...)
	if _, rest := streamFloor(after); planShape(rest) != before {
		t.Fatalf("the claim's plan changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if !strings.Contains(after, "effects_claim_idx") {
		t.Fatalf("the claim does not use effects_claim_idx:\n%s", after)
	}
	ordered := explain(ctx, t, pool, "ordered claim", claimSQL, "o", 10, "w", 60.0, 1)
	if !strings.Contains(ordered, "effects_ordering_idx") || strings.Contains(ordered, "Seq Scan on effects") {
		t.Fatalf("the head-of-line check does not probe effects_ordering_idx:\n%s", ordered)
	}
	if !strings.Contains(ordered, "effects_ordered_leases_idx") {
		t.Fatalf("the check for a later leased effect does not probe effects_ordered_leases_idx:\n%s", ordered)
	}
	// The stream floor (notBehindStreamSQL, migration 00034) is one
	// InitPlan: never run for a queue without ordered effects, run once
	// (not per candidate) for an ordered one.
	for q, want := range map[string]string{"q": "(never executed)", "o": "loops=1)"} {
		plan := explainAnalyze(ctx, t, pool, "claim of "+q, claimSQL, q, 10, "w", 60.0, 1)
		floor, _ := streamFloor(plan)
		if len(floor) < 2 {
			t.Fatalf("claim of queue %s: no stream floor in its plan:\n%s", q, plan)
		}
		if top := strings.TrimSpace(floor[1]); !strings.HasSuffix(top, want) {
			t.Errorf("claim of queue %s: the stream floor ran %q, want %s", q, top, want)
		}
	}
	blocked := explain(ctx, t, pool, "blocked keys", blockedKeysSQL, "", false, 100)
	if strings.Contains(blocked, "Seq Scan on effects") || !strings.Contains(blocked, "effects_ordering_idx") {
		t.Errorf("blocked keys does not read effects_ordering_idx:\n%s", blocked)
	}
	t.Logf("unordered claim:\n%s\nordered claim:\n%s\nblocked keys:\n%s", after, ordered, blocked)
}

func orderedPool(t *testing.T) (*pgxpool.Pool, context.Context) {
	t.Helper()
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return pool, ctx
}

// Two transactions enqueue to one ordering key; the one that draws its id
// first is held open while the other commits. Without the ordering lock the
// later id would commit first (and a claim could deliver it before the
// earlier id exists); with it, the second enqueue waits for the first
// transaction, draws its id after the first commits, and id order is commit
// order.
func TestOrderedEnqueueIDOrderIsCommitOrder(t *testing.T) {
	t.Parallel()
	pool, ctx := orderedPool(t)
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	first, err := Insert(ctx, tx1, []NewEffect{{Queue: "q", Type: "t", Key: "a", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	// An unordered effect and another key are not held back by tx1.
	free, err := Insert(ctx, pool, []NewEffect{
		{Queue: "q", Type: "t", Key: "free", Payload: []byte(`{}`), MaxAttempts: 8},
		{Queue: "q", Type: "t", Key: "other", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan []Inserted, 1)
	errc := make(chan error, 1)
	go func() {
		tx2, err := pool.Begin(ctx)
		if err != nil {
			errc <- err
			return
		}
		defer func() { _ = tx2.Rollback(ctx) }()
		ins, err := Insert(ctx, tx2, []NewEffect{{Queue: "q", Type: "t", Key: "b", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"}})
		if err == nil {
			err = tx2.Commit(ctx)
		}
		second <- ins
		errc <- err
	}()
	// tx2 waits for tx1's ordering lock: seen in pg_locks, not by sleeping.
	// Without the lock, tx2 commits b, whose id is above a's, while a is
	// still uncommitted: a claim now would deliver b first.
	if !waitForLockWaiter(ctx, t, pool, errc) {
		c, _ := Claim(ctx, pool, "q", "w", 10, time.Minute)
		t.Fatalf("b committed while a (id %d, lower) was still uncommitted; a claim now takes %+v", first[0].ID, c)
	}
	// A claim now sees neither a nor b (uncommitted), and the free effects.
	claimed, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 2 || claimed[0].ID != free[0].ID || claimed[1].ID != free[1].ID {
		t.Fatalf("claimed %+v while tx1 holds k, want the free effects %v", claimed, free)
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	b := <-second
	if b[0].ID <= first[0].ID {
		t.Fatalf("b (committed second) has id %d, a (committed first) %d: id order is not commit order", b[0].ID, first[0].ID)
	}
	// Head of line: a is claimable, b not until a is completed.
	claimed, err = Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 || claimed[0].ID != first[0].ID {
		t.Fatalf("claimed %+v, want only a (%d)", claimed, first[0].ID)
	}
	if c, err := Claim(ctx, pool, "q", "w", 10, time.Minute); err != nil || len(c) != 0 {
		t.Fatalf("claimed %+v (%v) while a is leased, want nothing", c, err)
	}
	done, err := Complete(ctx, pool, []Fence{{ID: claimed[0].ID, Token: claimed[0].Token, Type: "t"}})
	if err != nil || len(done) != 1 {
		t.Fatalf("complete a: %v %v", done, err)
	}
	claimed, err = Claim(ctx, pool, "q", "w", 10, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].ID != b[0].ID {
		t.Fatalf("claimed %+v (%v) after a completed, want b (%d)", claimed, err, b[0].ID)
	}
}

func waitForLockWaiter(ctx context.Context, t *testing.T, pool *pgxpool.Pool, done <-chan error) bool {
	t.Helper()
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return true
		}
		select {
		case <-ctx.Done():
			t.Fatal("no transaction waits for the ordering lock")
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return false
		case <-time.After(time.Millisecond):
		}
	}
}

// Each blocking state holds the key's next effect back; completed never
// does; a dead letter does unless its type moves on; an unordered effect and
// another key are never held back.
func TestHeadOfLineStates(t *testing.T) {
	t.Parallel()
	pool, ctx := orderedPool(t)
	for _, c := range []struct {
		state, typ string
		blocks     bool
	}{
		{"available", "t", true},
		{"leased", "t", true},
		{"reconciliation_required", "t", true},
		{"dead_letter", "t", true},
		{"dead_letter", "moveon", false},
		{"completed", "t", false},
	} {
		if _, err := pool.Exec(ctx, `TRUNCATE pgoutbox.effects`); err != nil {
			t.Fatal(err)
		}
		if _, err := SetOrderingChoices(ctx, pool, []string{"q"}, []string{"t", "moveon"}, []bool{false, true}); err != nil {
			t.Fatal(err)
		}
		ins, err := Insert(ctx, pool, []NewEffect{
			{Queue: "q", Type: c.typ, Key: "head", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k", Delay: time.Hour},
			{Queue: "q", Type: "t", Key: "next", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"},
			{Queue: "q", Type: "t", Key: "other", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k2"},
			{Queue: "q", Type: "t", Key: "free", Payload: []byte(`{}`), MaxAttempts: 8},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = $2::pgoutbox.effect_state,
			lease_token = CASE WHEN $2 = 'leased' THEN gen_random_uuid() END,
			lease_expires_at = CASE WHEN $2 = 'leased' THEN now() + interval '1 hour' END WHERE id = $1`,
			ins[0].ID, c.state); err != nil {
			t.Fatal(err)
		}
		claimed, err := Claim(ctx, pool, "q", "w", 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got := map[int64]bool{}
		for _, cl := range claimed {
			got[cl.ID] = true
		}
		if got[ins[1].ID] == c.blocks || !got[ins[2].ID] || !got[ins[3].ID] || got[ins[0].ID] {
			t.Errorf("head %s (%s): claimed %v of head %d, next %d, other key %d, unordered %d; next blocked want %v",
				c.state, c.typ, got, ins[0].ID, ins[1].ID, ins[2].ID, ins[3].ID, c.blocks)
		}
		// The operator's view agrees.
		blocked, err := BlockedKeys(ctx, pool, "", false, 10)
		if err != nil {
			t.Fatal(err)
		}
		if c.blocks != (len(blocked) == 1) || (c.blocks && (blocked[0].HeadID != ins[0].ID || blocked[0].HeadState != c.state ||
			blocked[0].Waiting != 1 || blocked[0].OrderingKey != "k")) {
			t.Errorf("head %s (%s): blocked keys %+v", c.state, c.typ, blocked)
		}
	}
}

// The ordering key cannot be changed once written.
func TestOrderingKeyImmutable(t *testing.T) {
	t.Parallel()
	pool, ctx := orderedPool(t)
	ins, err := Insert(ctx, pool, []NewEffect{{Queue: "q", Type: "t", Key: "a", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `UPDATE pgoutbox.effects SET ordering_key = 'other' WHERE id = $1`, ins[0].ID)
	if v, ok := MapError(err).(*Violation); !ok || v.Constraint != "effects_ordering_key_immutable" {
		t.Fatalf("changing the ordering key: %v, want effects_ordering_key_immutable", err)
	}
}

// One transaction may enqueue any number of ordering keys: the ordering
// locks are stripes (at most 1,024 row locks), not one lock per key, which
// overflowed the server's lock table ("out of shared memory") at 20,000
// keys.
func TestOrderedEnqueueManyKeysInOneTransaction(t *testing.T) {
	t.Parallel()
	pool, ctx := orderedPool(t)
	effects := make([]NewEffect, 20_000)
	for i := range effects {
		effects[i] = NewEffect{Queue: "q", Type: "t", Key: fmt.Sprint(i), Payload: []byte(`{}`), MaxAttempts: 8,
			OrderingKey: fmt.Sprint("k", i)}
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := Insert(ctx, tx, effects); err != nil {
		t.Fatal(err)
	}
	// The stripes this transaction locked carry its xid.
	var locks int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.ordering_stripes
		WHERE xmax::text::bigint = txid_current() % 4294967296`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if locks == 0 || locks > 1024 {
		t.Fatalf("%d ordering locks held for 20,000 keys of one queue, want 1 to 1,024 (the stripes)", locks)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// Ordered enqueues and claims work in every query mode a transaction
// pooler allows (docs/poolers.md): the arrays of ordering keys (with NULLs)
// have a text encoding.
func TestOrderedEnqueueSimpleProtocol(t *testing.T) {
	t.Parallel()
	_, dsn := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec} {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ins, err := Insert(ctx, pool, []NewEffect{
			{Queue: mode.String(), Type: "t", Key: "a", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"},
			{Queue: mode.String(), Type: "t", Key: "b", Payload: []byte(`{}`), MaxAttempts: 8},
			{Queue: mode.String(), Type: "t", Key: "c", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"},
		})
		if err != nil {
			pool.Close()
			t.Fatalf("%v: %v", mode, err)
		}
		claimed, err := Claim(ctx, pool, mode.String(), "w", 10, time.Minute)
		pool.Close()
		if err != nil || len(claimed) != 2 || claimed[0].ID != ins[0].ID || claimed[1].ID != ins[1].ID {
			t.Fatalf("%v: claimed %d (%v), want a and b", mode, len(claimed), err)
		}
	}
}

// The ordering choice is per (queue, type) (migration 00018): a
// registration in one queue changes no other queue's choice and reports a
// recorded choice it changed; a (queue, type) without a row falls back to
// the type's pre-00018 ordering_types row, then to strict.
func TestOrderingChoicePerQueueAndFallback(t *testing.T) {
	t.Parallel()
	pool, ctx := orderedPool(t)
	set := func(queue, typ string, movesOn bool) []OrderingChange {
		t.Helper()
		ch, err := SetOrderingChoices(ctx, pool, []string{queue}, []string{typ}, []bool{movesOn})
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}
	if ch := set("qa", "t", true); len(ch) != 0 {
		t.Fatalf("first registration reported changes %+v", ch)
	}
	if ch := set("qb", "t", false); len(ch) != 0 {
		t.Fatalf("another queue's registration reported changes %+v", ch)
	}
	if ch := set("qa", "t", true); len(ch) != 0 {
		t.Fatalf("the same choice again reported changes %+v", ch)
	}
	if ch := set("qa", "t", false); len(ch) != 1 || ch[0].Queue != "qa" || ch[0].Type != "t" || ch[0].MovesOn || ch[0].FormerSince.IsZero() {
		t.Fatalf("changing qa's choice reported %+v, want one change of qa/t to strict", ch)
	}
	set("qa", "t", true)
	set("qd", "legacy", false)
	if _, err := pool.Exec(ctx, `INSERT INTO pgoutbox.ordering_types (effect_type, dead_letter_moves_on) VALUES ('legacy', true)`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		queue, typ string
		movesOn    bool
	}{
		{"qa", "t", true},       // its own row
		{"qb", "t", false},      // its own row, though qa's moves on
		{"qc", "legacy", true},  // no row: the type's ordering_types row
		{"qd", "legacy", false}, // its own row wins over the fallback
		{"qe", "t", false},      // no row anywhere: strict
	} {
		ins, err := Insert(ctx, pool, []NewEffect{
			{Queue: c.queue, Type: c.typ, Key: "head", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"},
			{Queue: c.queue, Type: c.typ, Key: "next", Payload: []byte(`{}`), MaxAttempts: 8, OrderingKey: "k"},
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = 'dead_letter' WHERE id = $1`, ins[0].ID); err != nil {
			t.Fatal(err)
		}
		claimed, err := Claim(ctx, pool, c.queue, "w", 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if moved := len(claimed) == 1 && claimed[0].ID == ins[1].ID; moved != c.movesOn || len(claimed) > 1 {
			t.Errorf("%s/%s: claimed %d behind a dead letter, want the key to move on: %v", c.queue, c.typ, len(claimed), c.movesOn)
		}
	}
}
