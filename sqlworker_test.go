package pgoutbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// workerRole creates a NOLOGIN role that is a member of pgoutbox_worker
// (migration 00025) and drops it, with its grants, at cleanup.
func (b *bundle) workerRole(t *testing.T, prefix string) string {
	t.Helper()
	role := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if _, err := b.pool.Exec(b.ctx, `CREATE ROLE `+role+` NOLOGIN IN ROLE pgoutbox_worker`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, `DROP ROLE `+role); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	return role
}

// effectsDigest is every effect's state, attempts, lease and error, in id
// order: what a refused call must leave as it was.
func (b *bundle) effectsDigest(t *testing.T) string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT id, state::text, attempts, coalesce(lease_token::text, '-'),
		coalesce(lease_expires_at::text, '-'), coalesce(last_error, '-'), delivery_started_at IS NOT NULL
		FROM pgoutbox.effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	var id int64
	var state, token, expires, lastErr string
	var attempts int
	var started bool
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &attempts, &token, &expires, &lastErr, &started}, func() error {
		fmt.Fprintf(&sb, "%d %s %d %s %s %q %t\n", id, state, attempts, token, expires, lastErr, started)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// sqlLease is one row of pgoutbox.claim.
type sqlLease struct {
	ID    int64
	Type  string
	Token uuid.UUID
}

// claimAs runs pgoutbox.claim as role (the owner when role is empty).
func (b *bundle) claimAs(t *testing.T, role, queue string, n int) ([]sqlLease, error) {
	t.Helper()
	var out []sqlLease
	run := func(tx pgx.Tx) error {
		rows, err := tx.Query(b.ctx, `SELECT id, effect_type, lease_token FROM pgoutbox.claim($1, 'w1', $2, interval '30 seconds')`, queue, n)
		if err != nil {
			return err
		}
		var l sqlLease
		_, err = pgx.ForEachRow(rows, []any{&l.ID, &l.Type, &l.Token}, func() error { out = append(out, l); return nil })
		return err
	}
	if role == "" {
		return out, pgx.BeginFunc(b.ctx, b.pool, run)
	}
	return out, b.asRole(role, run)
}

// The worker functions (migration 00025) work only the queues the owner
// granted: a member of pgoutbox_worker without a grant is refused (42501)
// and changes nothing; with a grant on one queue it can neither claim from
// another nor complete, fail, start or extend another queue's lease, nor
// enqueue, nor manage grants; an enqueuer cannot work.
func TestSQLWorkerNeedsAGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sqlWorkerQueue(t, "w")
	b.sqlWorkerQueue(t, "other")
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "w", Type: "t", Key: "k1"},
		pgoutbox.Effect{Queue: "w", Type: "t", Key: "k2"},
		pgoutbox.Effect{Queue: "other", Type: "t", Key: "k3"})
	role := b.workerRole(t, "pgoutbox_worker_test")
	refused := func(sql string, args ...any) {
		t.Helper()
		before := b.effectsDigest(t)
		err := b.execAs(role, sql, args...)
		if pgCode(err) != "42501" {
			t.Fatalf("as %s, %s: %v, want insufficient_privilege (42501)", role, sql, err)
		}
		if after := b.effectsDigest(t); after != before {
			t.Fatalf("a refused %s changed the effects:\n%s\nwas\n%s", sql, after, before)
		}
	}
	fake := uuid.New()
	refused(`SELECT * FROM pgoutbox.claim('w', 'w1')`)
	refused(`SELECT * FROM pgoutbox.recover_expired('w')`)
	refused(`SELECT pgoutbox.complete($1, $2, 't')`, ids[0], fake)
	refused(`SELECT pgoutbox.fail($1, $2, 't', 'permanent', 'x', true)`, ids[0], fake)
	refused(`SELECT pgoutbox.mark_started($1, $2, 't')`, ids[0], fake)
	refused(`SELECT * FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[$2::uuid], ARRAY['t'], interval '1 minute')`, ids[0], fake)
	err := b.execAs(role, `SELECT * FROM pgoutbox.claim('w', 'w1')`)
	if msg := fmt.Sprint(err); !strings.Contains(msg, `may not work queue "w"`) || !strings.Contains(msg, "grant_work") {
		t.Fatalf("refusal %q: want it to name the queue and grant_work", msg)
	}

	var granted bool
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.grant_work($1, 'w')`, role).Scan(&granted); err != nil || !granted {
		t.Fatalf("grant_work: %t, %v", granted, err)
	}
	// The owner claims the other queue's effect; the worker may not touch it.
	other, err := b.claimAs(t, "", "other", 1)
	if err != nil || len(other) != 1 {
		t.Fatalf("owner's claim: %v, %v", other, err)
	}
	refused(`SELECT * FROM pgoutbox.claim('other', 'w1')`)
	refused(`SELECT pgoutbox.complete($1, $2, 't')`, other[0].ID, other[0].Token)
	refused(`SELECT pgoutbox.fail($1, $2, 't', 'permanent', 'x', true)`, other[0].ID, other[0].Token)
	refused(`SELECT pgoutbox.mark_started($1, $2, 't')`, other[0].ID, other[0].Token)
	refused(`SELECT * FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[$2::uuid], ARRAY['t'], interval '1 minute')`,
		other[0].ID, other[0].Token)
	refused(`SELECT * FROM pgoutbox.recover_expired('other')`)
	// Nor enqueue, nor read the table, nor manage grants.
	refused(`SELECT pgoutbox.enqueue('w', 't', 'k9')`)
	refused(`SELECT count(*) FROM pgoutbox.effects`)
	refused(`SELECT pgoutbox.grant_work($1, 'other')`, role)
	refused(`SELECT count(*) FROM pgoutbox.work_grants`)
	refused(`SELECT * FROM pgoutbox.work_claim_rows('other', 1, 'w1', 30, 1)`)

	// The granted queue works, for the role and its members.
	mine, err := b.claimAs(t, role, "w", 1)
	if err != nil || len(mine) != 1 || mine[0].ID != ids[0] {
		t.Fatalf("claim as %s: %v, %v; want effect %d", role, mine, err, ids[0])
	}
	member := fmt.Sprintf("%s_member", role)
	if _, err := b.pool.Exec(b.ctx, `CREATE ROLE `+member+` NOLOGIN IN ROLE `+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `DROP ROLE `+member) })
	if err := b.execAs(member, `SELECT pgoutbox.complete($1, $2, 't')`, mine[0].ID, mine[0].Token); err != nil {
		t.Fatalf("a member of %s: %v", role, err)
	}

	// An enqueuer is no worker.
	enq := b.tempRole(t, "pgoutbox_enq_test")
	if err := b.execAs(enq, `SELECT * FROM pgoutbox.claim('w', 'w1')`); pgCode(err) != "42501" {
		t.Fatalf("an enqueuer claimed: %v, want 42501", err)
	}

	// Revoked, the queue is closed again.
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.revoke_work($1, 'w')`, role).Scan(&n); err != nil || n != 1 {
		t.Fatalf("revoke_work: %d, %v; want 1", n, err)
	}
	refused(`SELECT * FROM pgoutbox.claim('w', 'w1')`)
}

// Every argument of the worker functions is bounded before anything is
// read or written (OB001, nothing changed), and a stale fence changes
// nothing and says so.
func TestSQLWorkerBoundsAndFences(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sqlWorkerQueue(t, "w")
	ids := b.enqueue(t, pgoutbox.Effect{Queue: "w", Type: "t", Key: "k1"})
	role := b.workerRole(t, "pgoutbox_worker_bounds")
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.grant_work($1, 'w')`, role); err != nil {
		t.Fatal(err)
	}
	leases, err := b.claimAs(t, role, "w", 1)
	if err != nil || len(leases) != 1 {
		t.Fatalf("claim: %v, %v", leases, err)
	}
	l := leases[0]
	invalid := func(sql string, args ...any) {
		t.Helper()
		before := b.effectsDigest(t)
		err := b.execAs(role, sql, args...)
		if pgCode(err) != "OB001" {
			t.Fatalf("%s: %v, want OB001", sql, err)
		}
		if after := b.effectsDigest(t); after != before {
			t.Fatalf("a refused %s changed the effects:\n%s\nwas\n%s", sql, after, before)
		}
	}
	invalid(`SELECT * FROM pgoutbox.claim('w', 'w1', 0)`)
	invalid(`SELECT * FROM pgoutbox.claim('w', 'w1', 1001)`)
	invalid(`SELECT * FROM pgoutbox.claim('w', '', 1)`)
	invalid(`SELECT * FROM pgoutbox.claim('w', repeat('x', 129), 1)`)
	invalid(`SELECT * FROM pgoutbox.claim('w', 'w1', 1, interval '0')`)
	invalid(`SELECT * FROM pgoutbox.claim('w', 'w1', 1, interval '2 days')`)
	invalid(`SELECT * FROM pgoutbox.claim('w', 'w1', 1, NULL)`)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'maybe', 'x', true)`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry', repeat('x', 65537), true)`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry', NULL, true)`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry', 'x', NULL)`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry_after', 'x', true)`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry', 'x', true, interval '1 second')`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry_after', 'x', true, interval '-1 second')`, l.ID, l.Token)
	invalid(`SELECT pgoutbox.fail($1, $2, 't', 'retry', 'x', true, NULL, interval '0')`, l.ID, l.Token)
	invalid(`SELECT * FROM pgoutbox.extend(ARRAY[]::bigint[], ARRAY[]::uuid[], ARRAY[]::text[], interval '1 minute')`)
	invalid(`SELECT * FROM pgoutbox.extend(ARRAY(SELECT g::bigint FROM generate_series(1, 1001) g),
		ARRAY(SELECT gen_random_uuid() FROM generate_series(1, 1001)), ARRAY(SELECT 't' FROM generate_series(1, 1001)),
		interval '1 minute')`)
	invalid(`SELECT * FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[$2::uuid, $2::uuid], ARRAY['t'], interval '1 minute')`, l.ID, l.Token)
	invalid(`SELECT * FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[NULL::uuid], ARRAY['t'], interval '1 minute')`, l.ID)
	invalid(`SELECT * FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[$2::uuid], ARRAY['t'], interval '0')`, l.ID, l.Token)
	invalid(`SELECT * FROM pgoutbox.recover_expired('w', 0)`)

	// Stale fences: another token, another type.
	before := b.effectsDigest(t)
	for _, f := range []struct {
		token uuid.UUID
		typ   string
	}{{uuid.New(), "t"}, {l.Token, "u"}} {
		var ok bool
		var state *string
		err := b.asRole(role, func(tx pgx.Tx) error {
			if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.complete($1, $2, $3)`, l.ID, f.token, f.typ).Scan(&ok); err != nil || ok {
				return fmt.Errorf("complete: %t, %v; want false", ok, err)
			}
			if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.mark_started($1, $2, $3)`, l.ID, f.token, f.typ).Scan(&ok); err != nil || ok {
				return fmt.Errorf("mark_started: %t, %v; want false", ok, err)
			}
			if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.fail($1, $2, $3, 'permanent', 'x', true)`, l.ID, f.token, f.typ).Scan(&state); err != nil || state != nil {
				return fmt.Errorf("fail: %v, %v; want NULL", state, err)
			}
			var n int
			if err := tx.QueryRow(b.ctx, `SELECT count(*) FROM pgoutbox.extend(ARRAY[$1::bigint], ARRAY[$2::uuid], ARRAY[$3], interval '1 minute')`,
				l.ID, f.token, f.typ).Scan(&n); err != nil || n != 0 {
				return fmt.Errorf("extend: %d held, %v; want 0", n, err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("fence (%s, %s): %v", f.token, f.typ, err)
		}
	}
	if after := b.effectsDigest(t); after != before {
		t.Fatalf("stale fences changed the effects:\n%s\nwas\n%s", after, before)
	}
	if err := b.execAs(role, `SELECT pgoutbox.complete($1, $2, 't')`, l.ID, l.Token); err != nil {
		t.Fatal(err)
	}
	var state string
	if err := b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&state); err != nil || state != "completed" {
		t.Fatalf("state %q, %v; want completed", state, err)
	}
}

// A non-replay-safe effect whose delivery started and whose lease expired
// is never delivered again: recover_expired sends it to
// reconciliation_required; a replay-safe one goes back to available, and
// an expired lease on its last attempt to dead_letter.
func TestSQLWorkerRecoversExpiredLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sqlWorkerQueue(t, "w")
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "w", Type: "unsafe", Key: "k1"},
		pgoutbox.Effect{Queue: "w", Type: "safe", Key: "k2"},
		pgoutbox.Effect{Queue: "w", Type: "safe", Key: "k3", MaxAttempts: 1})
	leases, err := b.claimAs(t, "", "w", 3)
	if err != nil || len(leases) != 3 {
		t.Fatalf("claim: %v, %v", leases, err)
	}
	var ok bool
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.mark_started($1, $2, 'unsafe')`, leases[0].ID, leases[0].Token).Scan(&ok); err != nil || !ok {
		t.Fatalf("mark_started: %t, %v", ok, err)
	}
	// The worker dies: its leases run out (moved back rather than waited for).
	if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET lease_expires_at = now() - interval '1 second' WHERE queue = 'w'`); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.mark_started($1, $2, 'safe')`, leases[1].ID, leases[1].Token).Scan(&ok); err != nil || ok {
		t.Fatalf("mark_started on an expired lease: %t, %v; want false", ok, err)
	}
	got := map[int64]string{}
	rows, err := b.pool.Query(b.ctx, `SELECT id, state FROM pgoutbox.recover_expired('w')`)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	var state string
	if _, err := pgx.ForEachRow(rows, []any{&id, &state}, func() error { got[id] = state; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{ids[0]: "reconciliation_required", ids[1]: "available", ids[2]: "dead_letter"}
	for id, s := range want {
		if got[id] != s {
			t.Errorf("effect %d recovered to %q, want %q (all: %v)", id, got[id], s, got)
		}
	}
}

// pgoutbox.fail backs off as Go's Lease.Fail does: 2^attempt s ±10 %, cut
// to the cap; retry_after no earlier than asked, cut to 1 hour or the cap
// when larger. Each pair of effects fails in one transaction whose now()
// the delay is measured from, so the delays are exact.
func TestSQLFailBacksOffLikeGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	boom := fmt.Errorf("boom")
	for i, c := range []struct {
		name     string
		attempts int // before the claim
		err      error
		outcome  string
		after    time.Duration
		cap      time.Duration
		min, max float64 // seconds
	}{
		{"retry", 0, pgoutbox.Retry(boom), "retry", 0, 300 * time.Second, 1.8, 2.2},
		{"retry under a 1 s cap", 0, pgoutbox.Retry(boom), "retry", 0, time.Second, 0.9, 1},
		{"retry at attempt 10", 9, pgoutbox.Retry(boom), "retry", 0, 300 * time.Second, 270, 300},
		{"retry_after", 0, pgoutbox.RetryAfter(10*time.Second, boom), "retry_after", 10 * time.Second, 300 * time.Second, 10, 10},
		{"retry_after shorter than the backoff", 4, pgoutbox.RetryAfter(time.Second, boom), "retry_after", time.Second, 300 * time.Second, 28.8, 35.2},
		{"retry_after cut to 1 hour", 0, pgoutbox.RetryAfter(2*time.Hour, boom), "retry_after", 2 * time.Hour, 300 * time.Second, 3600, 3600},
		{"retry_after cut to the cap", 0, pgoutbox.RetryAfter(3*time.Hour, boom), "retry_after", 3 * time.Hour, 2 * time.Hour, 7200, 7200},
	} {
		q := fmt.Sprintf("backoff-%d", i)
		b.enqueue(t, pgoutbox.Effect{Queue: q, Type: "t", Key: "go", MaxAttempts: 20},
			pgoutbox.Effect{Queue: q, Type: "t", Key: "sql", MaxAttempts: 20})
		if _, err := b.pool.Exec(b.ctx, `UPDATE pgoutbox.effects SET attempts = $2 WHERE queue = $1`, q, c.attempts); err != nil {
			t.Fatal(err)
		}
		leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, q, "w1", 2, time.Minute)
		if err != nil || len(leases) != 2 {
			t.Fatalf("%s: claim: %v, %v", c.name, leases, err)
		}
		var goDelay, sqlDelay float64
		err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := leases[0].Fail(b.ctx, tx, c.err, true, c.cap); err != nil {
				return err
			}
			var after *time.Duration
			if c.after > 0 {
				after = &c.after
			}
			var state string
			l := leases[1]
			if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.fail($1, $2, $3, $4, 'boom', true, $5, $6)`,
				l.ID, l.LeaseToken, l.Type, c.outcome, after, c.cap).Scan(&state); err != nil {
				return err
			}
			return tx.QueryRow(b.ctx, `SELECT
				(SELECT extract(epoch FROM available_at - now())::float8 FROM pgoutbox.effects WHERE id = $1),
				(SELECT extract(epoch FROM available_at - now())::float8 FROM pgoutbox.effects WHERE id = $2)`,
				leases[0].ID, l.ID).Scan(&goDelay, &sqlDelay)
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for who, d := range map[string]float64{"Go": goDelay, "SQL": sqlDelay} {
			if d < c.min-1e-6 || d > c.max+1e-6 {
				t.Errorf("%s: %s delayed %.3f s, want %.1f to %.1f s", c.name, who, d, c.min, c.max)
			}
		}
	}
}

// TestAnyLanguageWorkersExample runs the workers example of
// docs/any-language.md ("Workers in any language") statement by
// statement, as the owner and then as the worker's role: what it claims
// and completes is completed, what it fails permanently is dead-lettered,
// and the refusals it shows are refused.
func TestAnyLanguageWorkersExample(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := b.runDocExample(t, "workers example", "shop_worker", 2)
	rows, err := b.pool.Query(b.ctx, `SELECT state::text || ':' || coalesce(last_error, '-') FROM pgoutbox.effects ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"completed:-", "dead_letter:mailbox does not exist"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("effects %q, want %q", got, want)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.work_grants WHERE grantee = $1`, role); n != 0 {
		t.Fatalf("%d grants left, want none", n)
	}
}

// pgoutbox.claim keeps per-key ordering (it runs the engine's claim): of
// a key's effects only the head is claimed, the next one once the head is
// completed, while effects of other keys are claimed beside it.
func TestSQLWorkerKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sqlWorkerQueue(t, "w")
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "w", Type: "t", Key: "a1", OrderingKey: "a"},
		pgoutbox.Effect{Queue: "w", Type: "t", Key: "a2", OrderingKey: "a"},
		pgoutbox.Effect{Queue: "w", Type: "t", Key: "b1", OrderingKey: "b"})
	claimed := func() []int64 {
		t.Helper()
		leases, err := b.claimAs(t, "", "w", 10)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, l := range leases {
			out = append(out, l.ID)
			if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.complete($1, $2, $3)`, l.ID, l.Token, l.Type); err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	if got := claimed(); len(got) != 2 || got[0] != ids[0] || got[1] != ids[2] {
		t.Fatalf("first claim %v, want the heads %d and %d", got, ids[0], ids[2])
	}
	if got := claimed(); len(got) != 1 || got[0] != ids[1] {
		t.Fatalf("second claim %v, want %d once its key's head completed", got, ids[1])
	}
}

// A paused queue (migration 00023) is not claimed through the SQL worker
// functions either: pgoutbox.claim runs the engine's claim, pause check
// included, and claims again once the queue is resumed.
func TestSQLWorkerHonoursAPause(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sqlWorkerQueue(t, "w")
	b.enqueue(t, pgoutbox.Effect{Queue: "w", Type: "safe", Key: "p1"})
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.queue_pauses (queue, paused_by, reason) VALUES ('w', 'test', 'maintenance')`); err != nil {
		t.Fatal(err)
	}
	if leases, err := b.claimAs(t, "", "w", 1); err != nil || len(leases) != 0 {
		t.Fatalf("claim from a paused queue: %v, %v; want nothing claimed", leases, err)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM pgoutbox.queue_pauses WHERE queue = 'w'`); err != nil {
		t.Fatal(err)
	}
	if leases, err := b.claimAs(t, "", "w", 1); err != nil || len(leases) != 1 {
		t.Fatalf("claim after the resume: %v, %v; want the effect", leases, err)
	}
}
