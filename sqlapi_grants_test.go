package pgoutbox_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// asRole runs fn in a transaction of b's pool under SET LOCAL ROLE role
// (the way a member of the role calls the SQL API) and returns fn's error;
// the transaction commits only when fn succeeds.
func (b *bundle) asRole(role string, fn func(tx pgx.Tx) error) error {
	return pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(b.ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			return err
		}
		return fn(tx)
	})
}

// execAs runs sql as role and returns its error.
func (b *bundle) execAs(role, sql string, args ...any) error {
	return b.asRole(role, func(tx pgx.Tx) error { _, err := tx.Exec(b.ctx, sql, args...); return err })
}

// grantEnqueue lets role enqueue into queue (effect type typ; "" means
// every type), as the owner does.
func (b *bundle) grantEnqueue(t *testing.T, role, queue, typ string) {
	t.Helper()
	var ok bool
	var err error
	if typ == "" {
		err = b.pool.QueryRow(b.ctx, `SELECT pgoutbox.grant_enqueue($1, $2)`, role, queue).Scan(&ok)
	} else {
		err = b.pool.QueryRow(b.ctx, `SELECT pgoutbox.grant_enqueue($1, $2, $3)`, role, queue, typ).Scan(&ok)
	}
	if err != nil {
		t.Fatalf("grant_enqueue(%s, %s, %q): %v", role, queue, typ, err)
	}
}

// tempRole creates a NOLOGIN role that is a member of pgoutbox_enqueuer and
// drops it at cleanup.
func (b *bundle) tempRole(t *testing.T, prefix string) string {
	t.Helper()
	role := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if _, err := b.pool.Exec(b.ctx, `CREATE ROLE `+role+` NOLOGIN IN ROLE pgoutbox_enqueuer`); err != nil {
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

// The SQL API's role enqueues only what the owner granted (issue 27,
// point 2): nothing by default, then exactly the granted queue (and type),
// for the role and the roles that inherit it; a refusal is 42501 and writes
// nothing, a batch with one refused element writes none of them, and the
// role can neither read nor change the grants.
func TestSQLEnqueueNeedsAGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const role = "pgoutbox_enqueuer"
	refused := func(sql string, args ...any) {
		t.Helper()
		err := b.execAs(role, sql, args...)
		if pgCode(err) != "42501" {
			t.Fatalf("as %s, %s: %v, want insufficient_privilege (42501)", role, sql, err)
		}
	}
	allowed := func(sql string, args ...any) {
		t.Helper()
		if err := b.execAs(role, sql, args...); err != nil {
			t.Fatalf("as %s, %s: %v", role, sql, err)
		}
	}
	// Nothing granted: the applications' queues are closed.
	refused(`SELECT pgoutbox.enqueue('github', 'github.check_run.complete', 'k1', '{"conclusion": "success"}')`)
	refused(`SELECT * FROM pgoutbox.enqueue_batch('[{"queue": "q", "effect_type": "t", "idempotency_key": "k1"}]')`)
	if n := b.count(t); n != 0 {
		t.Fatalf("%d effects after refusals, want 0", n)
	}

	b.grantEnqueue(t, role, "q", "t")
	allowed(`SELECT pgoutbox.enqueue('q', 't', 'k1')`)
	refused(`SELECT pgoutbox.enqueue('q', 'other', 'k2')`)
	refused(`SELECT pgoutbox.enqueue('q2', 't', 'k3')`)
	refused(`SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`, `[
		{"queue": "q", "effect_type": "t", "idempotency_key": "k4"},
		{"queue": "github", "effect_type": "t", "idempotency_key": "k5"}]`)
	err := b.execAs(role, `SELECT pgoutbox.enqueue('github', 'github.check_run.complete', 'k6')`)
	if msg := err.Error(); !strings.Contains(msg, `may not enqueue effect type "github.check_run.complete" into queue "github"`) ||
		!strings.Contains(msg, "grant_enqueue") {
		t.Fatalf("refusal %q: want it to name the queue, the type and grant_enqueue", msg)
	}
	if n := b.count(t); n != 1 {
		t.Fatalf("%d effects, want the one granted", n)
	}

	// A queue-wide grant covers every type; a role inheriting the grantee
	// has its grants.
	b.grantEnqueue(t, role, "q2", "")
	allowed(`SELECT pgoutbox.enqueue('q2', 'any', 'k7')`)
	member := b.tempRole(t, "pgoutbox_app")
	if err := b.execAs(member, `SELECT pgoutbox.enqueue('q2', 'other', 'k8')`); err != nil {
		t.Fatalf("a member of %s: %v", role, err)
	}

	// Revoking one type leaves the rest; revoking the queue removes all.
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.revoke_enqueue($1, 'q', 't')`, role).Scan(&n); err != nil || n != 1 {
		t.Fatalf("revoke_enqueue: %d, %v; want 1", n, err)
	}
	refused(`SELECT pgoutbox.enqueue('q', 't', 'k9')`)
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.revoke_enqueue($1, 'q2')`, role).Scan(&n); err != nil || n != 1 {
		t.Fatalf("revoke_enqueue: %d, %v; want 1", n, err)
	}
	refused(`SELECT pgoutbox.enqueue('q2', 'any', 'k10')`)

	// Only the owner manages grants.
	refused(`SELECT pgoutbox.grant_enqueue('pgoutbox_enqueuer', 'github')`)
	refused(`SELECT pgoutbox.revoke_enqueue('pgoutbox_enqueuer', 'q')`)
	refused(`SELECT count(*) FROM pgoutbox.enqueue_grants`)
	refused(`INSERT INTO pgoutbox.enqueue_grants (grantee, queue) VALUES ('pgoutbox_enqueuer', 'github')`)
	if n := b.count(t); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
}

// A taken key answers its effect's id only to a role that may enqueue that
// effect's queue and type (issue 27, point 2): otherwise the role is
// refused (42501) without the id, and whether a key exists in a queue the
// role may not enqueue into is never answered.
func TestSQLEnqueueDuplicateKeyNeedsTheGrant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const role = "pgoutbox_enqueuer"
	key := pgoutbox.Key("refund.issue", "order-4711")
	if _, err := b.pool.Exec(b.ctx, `SELECT setval('pgoutbox.effects_id_seq', 987654320)`); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "refund", Type: "refund.issue", Key: key})[0]
	before := b.rowJSON(t, id)
	call := func(queue, typ string) (int64, error) {
		var got int64
		err := b.asRole(role, func(tx pgx.Tx) error {
			return tx.QueryRow(b.ctx, `SELECT pgoutbox.enqueue($1, $2, $3)`, queue, typ, key).Scan(&got)
		})
		return got, err
	}
	// Not granted: the same refusal whether the key exists or not.
	_, errTaken := call("refund", "refund.issue")
	if pgCode(errTaken) != "42501" {
		t.Fatalf("ungranted queue, taken key: %v, want 42501", errTaken)
	}
	errFree := b.execAs(role, `SELECT pgoutbox.enqueue('refund', 'refund.issue', 'never-used')`)
	if pgCode(errFree) != "42501" || errFree.Error() != errTaken.Error() {
		t.Fatalf("ungranted queue, free key: %v; want the taken key's refusal %v", errFree, errTaken)
	}

	// Granted another type of the queue: the key cannot be used, and the
	// id is not told.
	b.grantEnqueue(t, role, "refund", "email.send")
	_, err := call("refund", "email.send")
	if pgCode(err) != "42501" || strings.Contains(err.Error(), strconv.FormatInt(id, 10)) {
		t.Fatalf("a key of a type not granted: %v, want 42501 without the id %d", err, id)
	}
	batch := fmt.Sprintf(`[{"queue": "refund", "effect_type": "email.send", "idempotency_key": "fresh"},
		{"queue": "refund", "effect_type": "email.send", "idempotency_key": %q}]`, key)
	if err := b.execAs(role, `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`, batch); pgCode(err) != "42501" {
		t.Fatalf("a batch holding a key of a type not granted: %v, want 42501", err)
	}
	if n := b.count(t); n != 1 {
		t.Fatalf("%d effects, want 1: a refused batch writes nothing", n)
	}

	// Granted the effect's type (or the whole queue): the id, as Go answers.
	b.grantEnqueue(t, role, "refund", "refund.issue")
	if got, err := call("refund", "refund.issue"); err != nil || got != id {
		t.Fatalf("granted type: %d, %v; want %d", got, err, id)
	}
	if after := b.rowJSON(t, id); after != before {
		t.Fatalf("a duplicate changed the row:\n%s\n%s", before, after)
	}
}

// TestAnyLanguageGrantsExample runs the grants example of
// docs/any-language.md ("Grants: which queues and types") statement by
// statement, in one session, as the owner: the statements marked
// "-- refused: 42501" must be refused with that SQLSTATE, every other one
// must succeed, and the granted effects are written. The example's role is
// renamed for the run (roles belong to the cluster).
func TestAnyLanguageGrantsExample(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := b.runDocExample(t, "grants example", "shop_app", 2)
	got := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE (queue, effect_type) IN (('emails', 'email.receipt'), ('refunds', 'refund.request'))`)
	if n := b.count(t); n != 2 || got != 2 {
		t.Fatalf("%d effects (%d granted), want the 2 granted", n, got)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.enqueue_grants WHERE grantee = $1`, role); n != 1 {
		t.Fatalf("%d grants left, want the emails grant", n)
	}
	// Grants belong to the database; the example's role may go.
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.revoke_enqueue($1, 'emails')`, role); err != nil {
		t.Fatal(err)
	}
}

// runDocExample runs the SQL block of docs/any-language.md that follows
// "<!-- marker -->" statement by statement, in one session, as the owner,
// with the role named role renamed for the run (roles belong to the
// cluster; it is dropped at cleanup): the statements marked
// "-- refused: CODE" must be refused with that SQLSTATE (refusals of
// them), every other one must succeed. It returns the role's name in the
// run.
func (b *bundle) runDocExample(t *testing.T, marker, role string, refusals int) string {
	t.Helper()
	doc, err := os.ReadFile("docs/any-language.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, found := strings.Cut(string(doc), "<!-- "+marker+" -->\n```sql\n")
	block, _, closed := strings.Cut(after, "```")
	if !found || !closed {
		t.Fatalf("docs/any-language.md has no %s block", marker)
	}
	renamed := fmt.Sprintf("%s_%d", role, time.Now().UnixNano())
	block = strings.ReplaceAll(block, role, renamed)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, `DROP ROLE IF EXISTS `+renamed); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer func() { _, _ = conn.Exec(b.ctx, `RESET ROLE`) }()
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		sql, comment, _ := strings.Cut(line, "--")
		if sql = strings.TrimSpace(sql); sql == "" {
			continue
		}
		_, err := conn.Exec(b.ctx, sql)
		if want, refused := strings.CutPrefix(strings.TrimSpace(comment), "refused: "); refused {
			n++
			if pgCode(err) != want {
				t.Fatalf("%s: %v, want %s", sql, err, want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if n != refusals {
		t.Fatalf("%d refusals in the %s, want %d", n, marker, refusals)
	}
	return renamed
}
