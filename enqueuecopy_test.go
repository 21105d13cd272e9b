package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
)

// enqueueFunc is one of EnqueueBatch's two ways of sending a batch.
type enqueueFunc func(ctx context.Context, tx pgx.Tx, effects []pgoutbox.Effect, traceparent string) ([]int64, error)

// copyDiffStep is one transaction of TestEnqueueCopyMatchesArrays: its
// batches in order, then a commit or a rollback.
type copyDiffStep struct {
	name        string
	batches     [][]pgoutbox.Effect
	traceparent string
	rollback    bool
	isolation   pgx.TxIsoLevel
}

// TestEnqueueCopyMatchesArrays runs the same transactions through the
// parameter-array path and the COPY path on two fresh databases and
// requires the same ids, the same errors and the same rows (effects and
// key rows) after every step.
func TestEnqueueCopyMatchesArrays(t *testing.T) {
	t.Parallel()
	arrays, copied := setup(t), setup(t)
	at := time.Date(2031, 5, 6, 7, 8, 9, 123456000, time.UTC)
	big := make([]pgoutbox.Effect, 3*pgoutbox.CopyThreshold/2)
	for i := range big {
		big[i] = pgoutbox.Effect{Queue: "big", Type: "t", Key: fmt.Sprintf("b%d", i%1200),
			Payload: map[string]any{"i": i, "pad": strings.Repeat("x", i%300)}}
		if i%7 == 0 {
			big[i].OrderingKey = fmt.Sprintf("o%d", i%13)
		}
	}
	// 1e300 is 5 bytes of JSON and 301 characters of jsonb text.
	expands := json.RawMessage("[" + strings.Repeat("1e300,", 300) + "1]")
	steps := []copyDiffStep{
		{name: "fresh keys, every field", batches: [][]pgoutbox.Effect{{
			{Queue: "q", Type: "t", Key: "k1"},
			{Queue: "q", Type: "t2", Key: "k2", Payload: map[string]any{"n": 1.5, "s": "é\u2028", "z": nil}, MaxAttempts: 3},
			{Queue: "q", Type: "t", Key: "k3", AvailableAt: at, OrderingKey: "acct-1"},
			{Queue: "q", Type: "t", Key: "k4", Delay: 90 * time.Second, OrderingKey: "acct-1"},
			{Queue: "q2", Type: "t", Key: "k1", Payload: json.RawMessage(`{"b":[1,2,{"c":"d"}], "a":  100e-2}`), MaxAttempts: 1000},
			{Queue: "q", Type: "t", Key: "k5", OrderingKey: "acct-2", Payload: []byte(`[]`)},
		}}},
		{name: "repeats in the batch and existing keys", traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			batches: [][]pgoutbox.Effect{{
				{Queue: "q", Type: "t", Key: "k6", Payload: map[string]any{"first": true}},
				{Queue: "q", Type: "other", Key: "k6", Payload: map[string]any{"first": false}},
				{Queue: "q", Type: "t", Key: "k1", Payload: map[string]any{"ignored": true}},
				{Queue: "q3", Type: "t", Key: "k6", OrderingKey: "acct-1"},
				{Queue: "q2", Type: "t", Key: "k1"},
				{Queue: "q", Type: "t", Key: "k7", OrderingKey: "acct-1", MaxAttempts: 2},
			}}},
		{name: "two batches in one transaction", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "k8"}, {Queue: "q", Type: "t", Key: "k9", OrderingKey: "acct-3"}},
			{{Queue: "q", Type: "t", Key: "k9"}, {Queue: "q", Type: "t", Key: "k10", OrderingKey: "acct-3"}, {Queue: "q", Type: "t", Key: "k8"}},
		}},
		{name: "rolled back", rollback: true, batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "gone1"}, {Queue: "q", Type: "t", Key: "k1"}},
		}},
		{name: "the rolled-back keys again", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "gone1", MaxAttempts: 5}, {Queue: "q", Type: "t", Key: "gone1"}},
		}},
		{name: "large batch, repeats and ordering keys", batches: [][]pgoutbox.Effect{big}},
		{name: "serializable", isolation: pgx.Serializable, batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "k1"}, {Queue: "q", Type: "t", Key: "s1", OrderingKey: "acct-1"}},
		}},
		{name: "invalid effect", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "v1"}, {Queue: "q", Type: "t", Key: "v2", MaxAttempts: -1}},
		}},
		{name: "credential key", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "v3", Payload: map[string]any{"a": map[string]any{"password": "x"}}}},
		}},
		{name: "payload over the bound once stored", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "v4"}, {Queue: "q", Type: "t", Key: "v5", Payload: expands}},
		}},
		{name: "payload jsonb refuses", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "v6", Payload: json.RawMessage(`{"a":"\u0000"}`)}},
		}},
		{name: "after the errors", batches: [][]pgoutbox.Effect{
			{{Queue: "q", Type: "t", Key: "v1"}, {Queue: "q", Type: "t", Key: "v6"}, {Queue: "q", Type: "t", Key: "k2"}},
		}},
	}
	for _, s := range steps {
		want := runCopyDiffStep(t, arrays, s, pgoutbox.EnqueueBatchArrays)
		got := runCopyDiffStep(t, copied, s, pgoutbox.EnqueueBatchCopy)
		if got != want {
			t.Fatalf("%s: the COPY path answered\n%s\nthe arrays path\n%s", s.name, got, want)
		}
		if got, want := copyDiffRows(t, copied), copyDiffRows(t, arrays); !slices.Equal(got, want) {
			t.Fatalf("%s: rows differ\nCOPY:   %s\narrays: %s", s.name, strings.Join(got, "\n        "), strings.Join(want, "\n        "))
		}
	}
	if n := copied.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'big'`); n != 1200 {
		t.Fatalf("%d effects in queue big, want 1200", n)
	}
}

// runCopyDiffStep runs s through enqueue on b and describes what it
// answered: the ids of each batch, or the error.
func runCopyDiffStep(t *testing.T, b *bundle, s copyDiffStep, enqueue enqueueFunc) string {
	t.Helper()
	tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: s.isolation})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	var out []string
	for _, batch := range s.batches {
		ids, err := enqueue(b.ctx, tx, batch, s.traceparent)
		if err != nil {
			return fmt.Sprintf("%s; error %T: %v", strings.Join(out, "; "), err, err)
		}
		out = append(out, fmt.Sprint(ids))
	}
	if s.rollback {
		return strings.Join(out, "; ") + "; rolled back"
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "; ")
}

// copyDiffRows is every effect and key row of b, one line each; a
// schedule relative to the enqueue is given as its offset from created_at.
func copyDiffRows(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `
SELECT format('effect %s %s %s %s %s %s %s %s %s %s %s', id, queue, effect_type, idempotency_key, payload::text,
    max_attempts, CASE WHEN available_at > now() + interval '1 year' THEN available_at::text
                       ELSE (available_at - created_at)::text END,
    coalesce(ordering_key, '-'), coalesce(traceparent, '-'), state, attempts)
FROM pgoutbox.effects
UNION ALL
SELECT format('key %s %s %s', queue, idempotency_key, effect_id) FROM pgoutbox.effect_keys
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

// TestEnqueueCopyGivesAnEnqueuerNothing: a role that may only enqueue
// (through the SQL API, with a grant on the queue) gains nothing from the
// COPY path: it can create its own temporary table, but the statement that
// reads it writes pgoutbox's tables with the caller's privileges, so both
// paths refuse it alike (42501) and write nothing.
func TestEnqueueCopyGivesAnEnqueuerNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := b.tempRole(t, "copyenq")
	b.grantEnqueue(t, role, "q", "")
	batch := []pgoutbox.Effect{
		{Queue: "q", Type: "t", Key: "a"},
		{Queue: "q", Type: "t", Key: "b", OrderingKey: "o"},
	}
	answers := map[string]string{}
	for name, enqueue := range map[string]enqueueFunc{"arrays": pgoutbox.EnqueueBatchArrays, "copy": pgoutbox.EnqueueBatchCopy} {
		err := b.asRole(role, func(tx pgx.Tx) error {
			_, err := enqueue(b.ctx, tx, batch, "")
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s path as %s: %v, want insufficient_privilege (42501)", name, role, err)
		}
		answers[name] = err.Error()
	}
	if answers["arrays"] != answers["copy"] {
		t.Fatalf("the paths refuse differently:\narrays: %s\ncopy:   %s", answers["arrays"], answers["copy"])
	}
	if n := b.count(t); n != 0 {
		t.Fatalf("%d effects written by a role that may only enqueue through the SQL API", n)
	}
	// The grant still works through the SQL API.
	if err := b.execAs(role, `SELECT pgoutbox.enqueue('q', 't', 'c')`); err != nil {
		t.Fatal(err)
	}
}

// TestEnqueueCopyThroughPgBouncer: the COPY path works through a
// transaction-pooling PgBouncer (exec query mode), commits and rolls back
// with the caller's transaction, and leaves no temporary table behind for
// the next transaction on the server connection.
func TestEnqueueCopyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	p := setupPooled(t)
	batch := func(prefix string) []pgoutbox.Effect {
		out := make([]pgoutbox.Effect, pgoutbox.CopyThreshold)
		for i := range out {
			out[i] = pgoutbox.Effect{Queue: "q", Type: "t", Key: fmt.Sprintf("%s%d", prefix, i)}
		}
		return out
	}
	tx, err := p.pool.Begin(p.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgoutbox.EnqueueBatch(p.ctx, tx, batch("rolled")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(p.ctx); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		ids := p.enqueue(t, batch(fmt.Sprint("c", round))...)
		if len(ids) != pgoutbox.CopyThreshold || ids[0] == ids[len(ids)-1] {
			t.Fatalf("round %d: %d ids from %d to %d", round, len(ids), ids[0], ids[len(ids)-1])
		}
	}
	if n := p.count(t); n != 3*int64(pgoutbox.CopyThreshold) {
		t.Fatalf("%d effects, want %d (the rolled-back batch none)", n, 3*pgoutbox.CopyThreshold)
	}
	left := p.scalar(t, `SELECT count(*) FROM pg_class WHERE relname = 'pgoutbox_enqueue_stage'`)
	if left != 0 {
		t.Fatalf("%d staging tables outlived their transactions", left)
	}
}

// TestEnqueueCopyTakesTheOrderingLock: a COPY batch with an ordering key
// waits for an open transaction that enqueued to that key (by either path)
// before it draws any id, so the key's ids follow the commit order.
func TestEnqueueCopyTakesTheOrderingLock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(b.ctx) }()
	if _, err := pgoutbox.EnqueueBatchArrays(b.ctx, first, []pgoutbox.Effect{{Queue: "q", Type: "t", Key: "a", OrderingKey: "acct"}}, ""); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		ids []int64
		err error
	}
	second := make(chan answer, 1)
	go func() {
		var a answer
		a.err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			var err error
			a.ids, err = pgoutbox.EnqueueBatchCopy(b.ctx, tx, []pgoutbox.Effect{
				{Queue: "q", Type: "t", Key: "free"},
				{Queue: "q", Type: "t", Key: "b", OrderingKey: "acct"},
			}, "")
			return err
		})
		second <- a
	}()
	b.waitFor(t, "the COPY batch to wait for the ordering lock", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%ordering_lock%'`) > 0
	})
	// Later than the waiting batch's start, an id drawn now: the waiting
	// batch has drawn none yet.
	var drawn int64
	if err := first.QueryRow(b.ctx, `SELECT nextval('pgoutbox.effects_id_seq')`).Scan(&drawn); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	a := <-second
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.ids[0] <= drawn || a.ids[1] <= drawn {
		t.Fatalf("the COPY batch's ids %v were drawn before the first transaction ended (it drew %d)", a.ids, drawn)
	}
}

// A role that writes the tables directly but lacks the TEMPORARY privilege
// (revoked from PUBLIC) still enqueues a batch of CopyThreshold effects:
// EnqueueBatch sends it as arrays instead of aborting the caller's
// transaction on CREATE TEMPORARY TABLE.
func TestEnqueueCopyWithoutTemporaryPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t)
	role := fmt.Sprintf("notemp_%d", time.Now().UnixNano())
	for _, sql := range []string{
		`CREATE ROLE ` + role + ` NOLOGIN`,
		`DO $$ BEGIN EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database()); END $$`,
		`GRANT USAGE ON SCHEMA pgoutbox TO ` + role,
		`GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA pgoutbox TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgoutbox TO ` + role,
	} {
		if _, err := b.pool.Exec(b.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, `DROP OWNED BY `+role); err != nil {
			t.Errorf("drop owned: %v", err)
		}
		if _, err := b.pool.Exec(ctx, `DROP ROLE `+role); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	batch := make([]pgoutbox.Effect, pgoutbox.CopyThreshold)
	for i := range batch {
		batch[i] = pgoutbox.Effect{Queue: "q", Type: "t", Key: fmt.Sprint("k", i)}
	}
	err := b.asRole(role, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(b.ctx, tx, batch)
		return err
	})
	if err != nil {
		t.Fatalf("a role without TEMPORARY enqueuing %d effects: %v", len(batch), err)
	}
	if n := b.count(t); n != int64(len(batch)) {
		t.Fatalf("%d effects written, want %d", n, len(batch))
	}
}
