package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
)

// sqlEnqueue calls pgoutbox.enqueue inside tx.
func sqlEnqueue(ctx context.Context, tx pgx.Tx, e pgoutbox.Effect) (int64, error) {
	var payload *string
	if e.Payload != nil {
		b, err := json.Marshal(e.Payload)
		if err != nil {
			return 0, err
		}
		s := string(b)
		payload = &s
	}
	var avail *time.Time
	if !e.AvailableAt.IsZero() {
		avail = &e.AvailableAt
	}
	var okey *string // Go's "" (none) is SQL's NULL
	if e.OrderingKey != "" {
		okey = &e.OrderingKey
	}
	var id int64
	err := tx.QueryRow(ctx, `SELECT pgoutbox.enqueue($1, $2, $3, $4::text::json, $5, $6, $7, $8)`,
		e.Queue, e.Type, e.Key, payload, e.MaxAttempts, avail, e.Delay, okey).Scan(&id)
	return id, err
}

// rowWithoutIdentity is an effect row as JSON without its id and key, to
// compare rows written by different paths.
func (b *bundle) rowWithoutIdentity(t *testing.T, tx pgx.Tx, id int64) string {
	t.Helper()
	var s string
	if err := tx.QueryRow(b.ctx, `SELECT (to_jsonb(e) - 'id' - 'idempotency_key')::text FROM pgoutbox.effects e WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// Go's Enqueue and pgoutbox.enqueue write identical rows (every column but
// the id and the key, in one transaction so that now() is one instant).
func TestSQLEnqueueWritesGoRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := time.Date(2030, 1, 2, 3, 4, 5, 600000000, time.UTC)
	for i, e := range []pgoutbox.Effect{
		{Queue: "q", Type: "record.upsert"},
		{Queue: "search", Type: "record.upsert", Payload: map[string]any{"id": "r1", "n": 1.5, "tags": []string{"a", "b"}, "nested": map[string]any{"x": nil}}},
		{Queue: "q", Type: "t", Payload: []any{1, "two", true}, MaxAttempts: 3},
		{Queue: "q", Type: "t", Payload: "just a string", MaxAttempts: 1000, AvailableAt: at},
		{Queue: "q", Type: "t", Delay: 90*time.Second + 250*time.Millisecond},
		{Queue: "q", Type: "t", Payload: json.RawMessage(`{"a": 1, "a": 2, "b": 10000000000000000000001}`)},
		{Queue: "ü", Type: "型", Payload: map[string]any{"name": "x\ty"}},
		{Queue: "q", Type: "t", OrderingKey: "record-1"},
		{Queue: "q", Type: "t", OrderingKey: "ключ 型"},
	} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			e.Key = fmt.Sprintf("go-%d", i)
			goID, err := pgoutbox.Enqueue(b.ctx, tx, e)
			if err != nil {
				return fmt.Errorf("go: %w", err)
			}
			if raw, ok := e.Payload.(json.RawMessage); ok {
				e.Payload = raw
			}
			e.Key = fmt.Sprintf("sql-%d", i)
			sqlID, err := sqlEnqueue(b.ctx, tx, e)
			if err != nil {
				return fmt.Errorf("sql: %w", err)
			}
			if g, s := b.rowWithoutIdentity(t, tx, goID), b.rowWithoutIdentity(t, tx, sqlID); g != s {
				t.Errorf("effect %d:\nGo:  %s\nSQL: %s", i, g, s)
			}
			var keys int64
			if err := tx.QueryRow(b.ctx, `SELECT count(*) FROM pgoutbox.effect_keys WHERE effect_id IN ($1, $2)`, goID, sqlID).Scan(&keys); err != nil {
				return err
			}
			if keys != 2 {
				t.Errorf("effect %d: %d key rows for the two effects, want 2", i, keys)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("effect %d: %v", i, err)
		}
	}
}

// A key present in the queue returns the existing id and writes nothing,
// whichever side wrote it; a batch repeating a key gets one effect.
func TestSQLEnqueueDuplicateKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	goID := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "from-go", Payload: map[string]int{"v": 1}})[0]
	var sqlID int64
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.enqueue('q', 't', 'from-sql', '{"v": 1}')`).Scan(&sqlID); err != nil {
		t.Fatal(err)
	}
	before := b.rowJSON(t, goID)
	var again int64
	if err := b.pool.QueryRow(b.ctx, `SELECT pgoutbox.enqueue('q', 'other', 'from-go', '{"v": 2}', 5)`).Scan(&again); err != nil {
		t.Fatal(err)
	}
	if again != goID {
		t.Fatalf("SQL enqueue of Go's key returned %d, want %d", again, goID)
	}
	if after := b.rowJSON(t, goID); after != before {
		t.Fatalf("a duplicate changed the row:\n%s\n%s", before, after)
	}
	if got := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "from-sql"})[0]; got != sqlID {
		t.Fatalf("Go enqueue of the SQL key returned %d, want %d", got, sqlID)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT idx, id FROM pgoutbox.enqueue_batch($1::text::json) ORDER BY idx`, `[
		{"queue": "q", "effect_type": "t", "idempotency_key": "new"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "from-go"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "new", "payload": {"ignored": true}},
		{"queue": "q2", "effect_type": "t", "idempotency_key": "new"}]`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	var idx int32
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&idx, &id}, func() error {
		if int(idx) != len(ids) {
			return fmt.Errorf("row %d has index %d", len(ids), idx)
		}
		ids = append(ids, id)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 4 || ids[1] != goID || ids[0] != ids[2] || ids[3] == ids[0] {
		t.Fatalf("batch ids %v: want [n %d n m]", ids, goID)
	}
	if n, k := b.count(t), b.keyRows(t); n != 4 || k != 4 {
		t.Fatalf("%d effects and %d key rows, want 4 and 4", n, k)
	}
	if p := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE payload ? 'ignored'`); p != 0 {
		t.Fatal("the repeated key's payload was written")
	}
}

// Bad input is refused with its SQLSTATE and a message, and writes nothing:
// not the bad effect and not the good effects of its batch.
func TestSQLEnqueueBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "existing"})
	big := `{"a":"` + strings.Repeat("x", pgoutbox.MaxPayloadBytes) + `"}`
	good := `{"queue": "q", "effect_type": "t", "idempotency_key": "fresh"}`
	for _, c := range []struct {
		name, sql string
		args      []any
		code, msg string
	}{
		{"blank queue", `SELECT pgoutbox.enqueue(' ', 't', 'k')`, nil, "OB001", "queue must be 1-128 bytes"},
		{"NULL type", `SELECT pgoutbox.enqueue('q', NULL, 'k')`, nil, "OB001", "effect_type must be 1-128 bytes"},
		{"long key", `SELECT pgoutbox.enqueue('q', 't', repeat('k', 513))`, nil, "OB001", "idempotency_key must be 1-512 bytes"},
		{"max attempts", `SELECT pgoutbox.enqueue('q', 't', 'k', NULL, 1001)`, nil, "OB001", "max_attempts must be between 0 (default) and 1000"},
		{"infinite time", `SELECT pgoutbox.enqueue('q', 't', 'k', NULL, NULL, 'infinity')`, nil, "OB001", "available_at must be a finite time"},
		{"negative delay", `SELECT pgoutbox.enqueue('q', 't', 'k', delay => '-1 second')`, nil, "OB001", "delay must not be negative"},
		{"delay and time", `SELECT pgoutbox.enqueue('q', 't', 'k', available_at => now(), delay => '1 second')`, nil, "OB001",
			"delay cannot be combined with available_at"},
		{"batch: bad delay", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": "q", "effect_type": "t", "idempotency_key": "k", "delay": "soon"}]`}, "OB001", `delay "soon" is not an interval`},
		{"batch: negative delay", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": "q", "effect_type": "t", "idempotency_key": "k", "delay": -5}]`}, "OB001", "delay must not be negative"},
		{"oversized payload", `SELECT pgoutbox.enqueue('q', 't', 'k', $1::text::json)`, []any{big}, "OB002", "payload is 65544 bytes, over the 65536-byte limit"},
		{"credential key", `SELECT pgoutbox.enqueue('q', 't', 'k', '{"repo": {"deploy": [{"apiKey": "x"}]}}')`, nil, "OB003",
			"payload key $.repo.deploy[0].apiKey looks like a credential; secrets must not be stored in effects"},
		{"invalid JSON", `SELECT pgoutbox.enqueue('q', 't', 'k', $1::text::json)`, []any{`{"a":`}, "22P02", "invalid input syntax for type json"},
		{"batch: bad element after a good one", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[` + good + `, {"queue": "q", "effect_type": "t", "idempotency_key": "k", "payload": {"password": 1}}]`},
			"OB003", "effect 1: payload key $.password looks like a credential"},
		{"batch: unknown field", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[` + good + `, {"queue": "q", "effect_type": "t", "idempotency_key": "k", "maxAttempts": 3}]`},
			"OB001", `effect 1: invalid effect: unknown field "maxAttempts"`},
		{"batch: wrong type", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": 7, "effect_type": "t", "idempotency_key": "k"}]`}, "OB001", "queue must be a JSON string, not number"},
		{"batch: fractional attempts", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": "q", "effect_type": "t", "idempotency_key": "k", "max_attempts": 2.5}]`}, "OB001", "max_attempts must be between"},
		{"batch: bad time", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": "q", "effect_type": "t", "idempotency_key": "k", "available_at": "soon"}]`}, "OB001", `available_at "soon" is not a timestamp`},
		{"batch: not an array", `SELECT * FROM pgoutbox.enqueue_batch('{"queue": "q"}')`, nil, "OB001", "effects must be a JSON array"},
		{"batch: not objects", `SELECT * FROM pgoutbox.enqueue_batch('[1]')`, nil, "OB001", "must be a JSON object, not number"},
		{"blank ordering key", `SELECT pgoutbox.enqueue('q', 't', 'k', ordering_key => ' ')`, nil, "OB001", "ordering_key must be NULL (none) or 1-512 bytes"},
		{"batch: ordering key not a string", `SELECT * FROM pgoutbox.enqueue_batch($1::text::json)`,
			[]any{`[{"queue": "q", "effect_type": "t", "idempotency_key": "k", "ordering_key": 7}]`}, "OB001", "ordering_key must be a JSON string, not number"},
	} {
		before, keysBefore := b.count(t), b.keyRows(t)
		_, err := b.pool.Exec(b.ctx, c.sql, c.args...)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != c.code || !strings.Contains(pe.Message, c.msg) {
			t.Errorf("%s: got %v, want %s %q", c.name, err, c.code, c.msg)
			continue
		}
		if after, keysAfter := b.count(t), b.keyRows(t); after != before || keysAfter != keysBefore {
			t.Errorf("%s: effects %d → %d, key rows %d → %d", c.name, before, after, keysBefore, keysAfter)
		}
	}
	if n := b.count(t); n != 1 {
		t.Fatalf("%d effects, want the 1 enqueued first", n)
	}
}

// enqueue_batch takes ordering keys, stored as given (absent or null: none).
func TestSQLEnqueueBatchOrderingKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `SELECT * FROM pgoutbox.enqueue_batch('[
		{"queue": "q", "effect_type": "t", "idempotency_key": "a", "ordering_key": "k1"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "b", "ordering_key": null},
		{"queue": "q", "effect_type": "t", "idempotency_key": "c"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "d", "ordering_key": "k1"}]')`); err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(idempotency_key || '=' || coalesce(ordering_key, '-') ORDER BY id) FROM pgoutbox.effects`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := "a=k1 b=- c=- d=k1"; strings.Join(got, " ") != want {
		t.Fatalf("stored %v, want %s", got, want)
	}
}

// The key rows of a batch are inserted in canonical (queue, key) byte order,
// whatever the input order, so that two batches sharing keys lock them in
// one order: a fresh table's heap shows the insertion order.
func TestSQLEnqueueBatchInsertsKeysInCanonicalOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `SELECT * FROM pgoutbox.enqueue_batch('[
		{"queue": "q", "effect_type": "t", "idempotency_key": "z"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "a"},
		{"queue": "b", "effect_type": "t", "idempotency_key": "y"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "B"},
		{"queue": "q", "effect_type": "t", "idempotency_key": "m"}]')`); err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(queue || '/' || idempotency_key ORDER BY ctid) FROM pgoutbox.effect_keys`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if want := []string{"b/y", "q/B", "q/a", "q/m", "q/z"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("key rows inserted in order %v, want %v", got, want)
	}
	var ids []int64
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(id ORDER BY id) FROM pgoutbox.effects`).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	var byKey []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(idempotency_key ORDER BY id) FROM pgoutbox.effects`).Scan(&byKey); err != nil {
		t.Fatal(err)
	}
	if strings.Join(byKey, "") != "zayBm" {
		t.Fatalf("ids follow the keys %v, want the input order zayBm", byKey)
	}
}

// A key another transaction is inserting: the SQL enqueue waits for it and,
// once it commits, returns its id and writes nothing. The second enqueue is
// seen waiting on the first transaction's lock before the first commits.
func TestSQLEnqueueWaitsForConcurrentKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback(b.ctx) }()
	firstID, err := pgoutbox.Enqueue(b.ctx, first, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int32
	if err := conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		id  int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = conn.QueryRow(b.ctx, `SELECT pgoutbox.enqueue('q', 't', 'k', '{"second": true}')`).Scan(&r.id)
		done <- r
	}()
	b.waitFor(t, "the second enqueue to wait for the first transaction", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted AND locktype = 'transactionid'`, pid) == 1
	})
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.id != firstID {
		t.Fatalf("second enqueue: id %d, %v; want the first's id %d", r.id, r.err, firstID)
	}
	if n := b.count(t); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
}

// An effect enqueued through SQL wakes LISTENing workers at commit (the
// insert trigger's notification, limited by migration 00011).
func TestSQLEnqueueNotifies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(b.ctx, `LISTEN pgoutbox_effects`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.enqueue('woken', 't', 'k')`); err != nil {
		t.Fatal(err)
	}
	n, err := conn.WaitForNotification(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n.Channel != "pgoutbox_effects" || n.Payload != "woken" {
		t.Fatalf("notification %s %q, want pgoutbox_effects \"woken\"", n.Channel, n.Payload)
	}
	if s := b.scalar(t, `SELECT count(*) FROM pgoutbox.notify_state WHERE queue = 'woken'`); s != 1 {
		t.Fatalf("the limiter has %d rows for the queue, want 1", s)
	}
}

// pgoutbox_enqueuer may enqueue (both forms, into what it was granted) and
// compute keys, and nothing else: it cannot read or write the engine's tables or call the internal
// function directly. A role without it cannot enqueue at all.
func TestEnqueuerRoleMayOnlyEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outsider := fmt.Sprintf("pgoutbox_outsider_%d", time.Now().UnixNano())
	// The outsider may use the schema (to read a view, say): only the
	// revoked EXECUTE keeps it from enqueuing.
	if _, err := b.pool.Exec(b.ctx, `CREATE ROLE `+outsider+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := b.pool.Exec(ctx, `REVOKE USAGE ON SCHEMA pgoutbox FROM `+outsider); err != nil {
			t.Errorf("revoke: %v", err)
		}
		if _, err := b.pool.Exec(ctx, `DROP ROLE `+outsider); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	if _, err := b.pool.Exec(b.ctx, `GRANT USAGE ON SCHEMA pgoutbox TO `+outsider); err != nil {
		t.Fatal(err)
	}
	as := func(role string, fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `SET LOCAL ROLE `+role); err != nil {
				return err
			}
			return fn(tx)
		})
	}
	exec := func(sql string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error { _, err := tx.Exec(b.ctx, sql); return err }
	}
	b.grantEnqueue(t, "pgoutbox_enqueuer", "q", "t")
	for _, sql := range []string{
		`SELECT pgoutbox.enqueue('q', 't', pgoutbox.key('a', 'b'), '{"x": 1}')`,
		`SELECT * FROM pgoutbox.enqueue_batch('[{"queue": "q", "effect_type": "t", "idempotency_key": "c"}]')`,
	} {
		if err := as("pgoutbox_enqueuer", exec(sql)); err != nil {
			t.Fatalf("as pgoutbox_enqueuer, %s: %v", sql, err)
		}
	}
	if n := b.count(t); n != 2 {
		t.Fatalf("%d effects after the enqueuer's two calls, want 2", n)
	}
	refused := func(role, sql string) {
		t.Helper()
		err := as(role, exec(sql))
		if pgCode(err) != "42501" {
			t.Errorf("as %s, %s: %v, want insufficient_privilege (42501)", role, sql, err)
		}
	}
	for _, sql := range []string{
		`SELECT count(*) FROM pgoutbox.effects`,
		`SELECT count(*) FROM pgoutbox.effect_keys`,
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('q', 't', 'direct')`,
		`UPDATE pgoutbox.effects SET state = 'completed'`,
		`DELETE FROM pgoutbox.effects`,
		`SELECT pgoutbox.enqueue_rows('{q}', '{t}', '{k}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}', '{NULL}')`,
		// It runs with the caller's privileges (migration 00016).
		`SELECT * FROM pgoutbox.replay_dead_letters('{}', '', '', 10)`,
	} {
		refused("pgoutbox_enqueuer", sql)
	}
	refused(outsider, `SELECT pgoutbox.enqueue('q', 't', 'outsider')`)
	refused(outsider, `SELECT * FROM pgoutbox.enqueue_batch('[{"queue": "q", "effect_type": "t", "idempotency_key": "outsider"}]')`)
	if n := b.count(t); n != 2 {
		t.Fatalf("%d effects after the refusals, want 2", n)
	}
	var login bool
	if err := b.pool.QueryRow(b.ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = 'pgoutbox_enqueuer'`).Scan(&login); err != nil || login {
		t.Fatalf("pgoutbox_enqueuer: rolcanlogin %v (%v), want a NOLOGIN role", login, err)
	}
}

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
