package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The commands through a PgBouncer 1.18 in transaction mode, given a
// DATABASE_URL that does not choose a query mode (the CLI picks exec).
func TestCommandsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// An empty database: migrations are pending.
	admin := pgtest.AdminDSN(t)
	name := fmt.Sprintf("pgoutbox_pooler_cli_%d", time.Now().UnixNano())
	aconn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := aconn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	aconn.Close(ctx)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			c.Close(context.Background())
		}
	})
	pb := pgtest.NewPgBouncer(t, admin)
	pooledExec := pb.DSN(name)
	pooled := strings.Replace(pooledExec, "&default_query_exec_mode=exec", "", 1)
	if pooled == pooledExec {
		t.Fatalf("no query mode to strip from %s", pooledExec)
	}
	direct := strings.Replace(admin, "/postgres?", "/"+name+"?", 1)
	if direct == admin {
		t.Fatalf("cannot derive the direct URL from %s", admin)
	}

	// Through the pooler, pending migrations are refused, and nothing is
	// written.
	code, out, errs := run(t, "--database-url", pooled, "--log-level", "error", "migrate")
	if code != 1 || !strings.Contains(errs, "PGOUTBOX_SESSION_DATABASE_URL") {
		t.Fatalf("migrate through the pooler: exit %d, %q %q", code, out, errs)
	}
	var schemas int
	if err := pgxQueryRow(ctx, t, direct, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgoutbox'`, &schemas); schemas != 0 {
		t.Fatalf("a refused migrate created the schema (%d, %v)", schemas, err)
	}
	// With the session URL they run there.
	code, out, errs = run(t, "--database-url", pooled, "--session-database-url", direct, "migrate")
	if code != 0 || !strings.Contains(out, "applied 00001") {
		t.Fatalf("migrate with a session URL: exit %d, %q %q", code, out, errs)
	}
	code, out, errs = run(t, "--database-url", pooled, "--log-level", "error", "migrate")
	if code != 0 || !strings.Contains(out, "nothing applied") {
		t.Fatalf("migrate through the pooler when current: exit %d, %q %q", code, out, errs)
	}

	// Effects to look at: one dead letter, one stalled lease.
	pool, err := pgxpool.New(ctx, pooledExec)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var ids []int64
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "q", Type: "t", Key: "dead"}, {Queue: "q", Type: "t", Key: "stalled"}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = 'dead_letter', dead_lettered_at = now(), attempts = 1
		WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgoutbox.effects SET state = 'leased', attempts = 1, lease_owner = 'gone',
		lease_token = gen_random_uuid(), leased_at = now() - interval '1 hour', lease_expires_at = now() + interval '1 hour'
		WHERE id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}

	db := []string{"--database-url", pooled, "--log-level", "error"}
	cmd := func(args ...string) string {
		t.Helper()
		code, out, errs := run(t, append(append([]string{}, db...), args...)...)
		if code != 0 {
			t.Fatalf("%v through the pooler: exit %d, %q %q", args, code, out, errs)
		}
		return out
	}
	if out := cmd("status", "--json"); !strings.Contains(out, `"q"`) {
		t.Fatalf("status: %s", out)
	}
	var dl struct{ Items []struct{ ID int64 } }
	if out := cmd("dlq", "list", "--json"); json.Unmarshal([]byte(out), &dl) != nil || len(dl.Items) != 1 || dl.Items[0].ID != ids[0] {
		t.Fatalf("dlq list: %s", out)
	}
	code, out, _ = run(t, append(append([]string{}, db...), "alert", "check", "--fail-on-alert")...)
	if code != 3 || !strings.Contains(out, "dead_letters") {
		t.Fatalf("alert check: exit %d, %s", code, out)
	}
	cmd("dlq", "replay", "--id", fmt.Sprint(ids[0]))
	cmd("requeue-stale")
	var available int
	if err := pgxQueryRow(ctx, t, direct, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available'`, &available); err != nil || available != 2 {
		t.Fatalf("after replay and requeue-stale: %d available (%v), want 2", available, err)
	}
}

func pgxQueryRow(ctx context.Context, t *testing.T, dsn, sql string, dst any) error {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.QueryRow(ctx, sql).Scan(dst)
}
