package pgtest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

func TestMain(m *testing.M) {
	Main(m, func() error { return goleak.Find() })
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestNewDBIsMigrated(t *testing.T) {
	t.Parallel()
	conn := connect(t, NewDB(t))
	ctx := context.Background()
	var effects, versions bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('pgoutbox.effects') IS NOT NULL,
		EXISTS (SELECT FROM pgoutbox.goose_db_version WHERE version_id > 0)`).Scan(&effects, &versions); err != nil {
		t.Fatal(err)
	}
	if !effects || !versions {
		t.Fatalf("pgoutbox.effects exists: %v, migrations recorded: %v", effects, versions)
	}
}

func TestNewDBsAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, _ := NewPool(t)
	b, _ := NewPool(t)
	var nameA, nameB string
	if err := a.QueryRow(ctx, `SELECT current_database()`).Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, `SELECT current_database()`).Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB {
		t.Fatalf("both pools are on database %s", nameA)
	}
	if _, err := a.Exec(ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key) VALUES ('q', 'e', 'k')`); err != nil {
		t.Fatal(err)
	}
	var inA, inB int
	if err := a.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&inA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&inB); err != nil {
		t.Fatal(err)
	}
	if inA != 1 || inB != 0 {
		t.Fatalf("effects in %s: %d (want 1), in %s: %d (want 0)", nameA, inA, nameB, inB)
	}
}

func TestNewDBIsDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("inner", func(t *testing.T) {
		conn := connect(t, NewDB(t))
		if err := conn.QueryRow(context.Background(), `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		// Left open on purpose: the cleanup drops WITH (FORCE).
	})
	conn := connect(t, AdminDSN(t))
	var exists bool
	if err := conn.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if name == "" || exists {
		t.Fatalf("database %q still exists after its test's cleanup", name)
	}
}

func TestTemplateNameHashesMigrations(t *testing.T) {
	name, err := templateName()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(name, "pgoutbox_tpl_") || len(name) != len("pgoutbox_tpl_")+12 {
		t.Fatalf("template name %q", name)
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p@h:5/postgres?sslmode=disable": "postgres://u:p@h:5/x?sslmode=disable",
		"postgresql://h/":               "postgresql://h/x",
		"host=h user=u dbname=postgres": "host=h user=u dbname=postgres dbname=x",
	} {
		if got := withDatabase(in, "x"); got != want {
			t.Errorf("withDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestThrowawayCluster exercises the path AdminDSN takes when no server is
// configured or running: a cluster in a temporary directory, started,
// used, stopped and deleted.
func TestThrowawayCluster(t *testing.T) {
	t.Parallel()
	if err := embedded.CheckBinaries(); errors.Is(err, embedded.ErrNoBinaries) {
		t.Skip(err)
	}
	ctx := context.Background()
	tc, err := startTempCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			tc.stop()
		}
	})
	if !strings.HasPrefix(filepath.Base(tc.c.Dir()), tempDirPrefix) {
		t.Errorf("cluster directory %s", tc.c.Dir())
	}
	conn, err := pgx.Connect(ctx, tc.dsn("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var fsync string
	if err := conn.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	if fsync != "off" {
		t.Errorf("fsync = %s on a throwaway cluster", fsync)
	}
	stopped = true
	if err := tc.stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tc.c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory survives stop: %v", err)
	}
	if embedded.PortFree(tc.port) == false {
		t.Errorf("port %d still in use after stop", tc.port)
	}
}

func TestSweepTempClusters(t *testing.T) {
	// A pid that no longer runs: a finished child's.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip(err)
	}
	dead := cmd.Process.Pid
	mk := func(owner int) string {
		dir, err := os.MkdirTemp("", tempDirPrefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(owner)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	stale, live := mk(dead), mk(os.Getpid())
	sweepTempClusters()
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale directory kept: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("live directory removed: %v", err)
	}
}

// TestAdminDSNForcedCluster checks, when PGTEST_FORCE_CLUSTER is set, that
// AdminDSN really gave us a throwaway cluster of our own.
func TestAdminDSNForcedCluster(t *testing.T) {
	if !forceCluster() {
		t.Skip(envForceCluster + " not set")
	}
	dsn := AdminDSN(t)
	throwaway.mu.Lock()
	tc := throwaway.tc
	throwaway.mu.Unlock()
	if tc == nil || dsn != tc.dsn("postgres") {
		t.Fatalf("AdminDSN %s is not a throwaway cluster", dsn)
	}
	if _, err := os.Stat(tc.c.DataDir()); err != nil {
		t.Fatal(err)
	}
}

// NewPgBouncer's PgBouncer pools in transaction mode: a second client's
// transaction runs on the server connection the first client's statement
// just released, which no direct PostgreSQL connection could share.
func TestPgBouncerPoolsTransactions(t *testing.T) {
	t.Parallel()
	pooled, direct := NewPooledDB(t)
	if pooled == direct {
		t.Fatal("the pooled DSN is the direct one")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := pgx.Connect(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	b, err := pgx.Connect(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	var pa, pb int32
	if err := a.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pa); err != nil {
		t.Fatal(err)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pb); err != nil {
		t.Fatal(err)
	}
	if pa != pb {
		t.Fatalf("client b's transaction runs on backend %d, not on %d which client a released: not transaction pooling", pb, pa)
	}
	var db string
	if err := tx.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil || !strings.HasPrefix(db, "pgoutbox_t_") {
		t.Fatalf("through pgbouncer: database %q, %v", db, err)
	}
}

// A Cluster survives an immediate stop (a crash): a committed row is there
// after the restart on the same port, and stopping twice is harmless.
func TestClusterImmediateRestartKeepsCommits(t *testing.T) {
	t.Parallel()
	if err := embedded.CheckBinaries(); errors.Is(err, embedded.ErrNoBinaries) {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := NewCluster(t)
	dsn := cl.NewDB(t)
	conn := connect(t, dsn)
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	port := cl.Port()
	if _, err := cl.Restart(ctx, StopImmediate); err != nil {
		t.Fatalf("restart: %v\n%s", err, embedded.Tail(cl.LogFile(), 20))
	}
	if !cl.Running() || cl.Port() != port {
		t.Fatalf("after restart: running %v, port %d (was %d)", cl.Running(), cl.Port(), port)
	}
	var v int
	if err := connect(t, dsn).QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("committed row after an immediate stop: %d, %v", v, err)
	}
	if err := cl.Stop(StopImmediate); err != nil {
		t.Fatal(err)
	}
	if err := cl.Stop(StopImmediate); err != nil || cl.Running() {
		t.Fatalf("second stop: %v, running %v", err, cl.Running())
	}
	if err := cl.Stop("slow"); err != nil {
		t.Fatalf("stop of a stopped cluster with any mode does nothing: %v", err)
	}
}
