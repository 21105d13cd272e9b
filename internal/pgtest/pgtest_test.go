package pgtest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
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
	if _, err := findBinaries(0); errors.Is(err, errNoBinaries) {
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
	if !strings.HasPrefix(filepath.Base(tc.c.dir), tempDirPrefix) {
		t.Errorf("cluster directory %s", tc.c.dir)
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
	if _, err := os.Stat(tc.c.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cluster directory survives stop: %v", err)
	}
	if portFree(tc.port) == false {
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

// localDir is a directory for EnsureLocal that the postgres OS user can
// reach when we are root (t.TempDir's parent is mode 0700).
func localDir(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "pgtest-local-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, ".pgoutbox")
	t.Cleanup(func() {
		if err := ResetLocal(dir); err != nil {
			t.Error(err)
		}
		os.RemoveAll(parent)
	})
	return dir
}

func TestEnsureLocalReusesCluster(t *testing.T) {
	t.Parallel()
	if _, err := findBinaries(0); errors.Is(err, errNoBinaries) {
		t.Skip(err)
	}
	ctx := context.Background()
	dir := localDir(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ensure := func(wantVerb string) string {
		t.Helper()
		logs.Reset()
		dsn, err := EnsureLocal(ctx, dir, log)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), wantVerb+" embedded PostgreSQL at "+dir) {
			t.Fatalf("want %q logged, got:\n%s", wantVerb, logs.String())
		}
		conn := connect(t, dsn)
		var db string
		if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		if db != LocalDatabase {
			t.Fatalf("connected to %s", db)
		}
		conn.Close(ctx)
		return dsn
	}

	first := ensure("created")
	if second := ensure("reusing"); second != first {
		t.Fatalf("reused cluster has DSN %s, first had %s", second, first)
	}
	if err := StopLocal(dir); err != nil {
		t.Fatal(err)
	}
	if third := ensure("starting"); third != first {
		t.Fatalf("restarted cluster moved: %s, was %s", third, first)
	}

	// Someone else takes the stored port while the cluster is stopped.
	if err := StopLocal(dir); err != nil {
		t.Fatal(err)
	}
	port := intInFile(filepath.Join(dir, localPortFile))
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	moved := ensure("starting")
	if moved == first || !strings.Contains(logs.String(), "stored port is in use") {
		t.Fatalf("cluster did not move off a taken port: %s; log:\n%s", moved, logs.String())
	}
	if next := intInFile(filepath.Join(dir, localPortFile)); next == port {
		t.Fatalf("port file still says %d", port)
	}

	if err := ResetLocal(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory survives ResetLocal: %v", err)
	}
}

// TestEnsureLocalUnreachableAsRoot: run as root from a directory the
// postgres OS user cannot reach (a 0700 home), the cluster lives under
// relocationRoot, is found again by EnsureLocal, StopLocal and ResetLocal,
// and ResetLocal deletes both places.
func TestEnsureLocalUnreachableAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root delegates to the postgres OS user")
	}
	if _, err := findBinaries(0); errors.Is(err, errNoBinaries) {
		t.Skip(err)
	}
	ctx := context.Background()
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, ".pgoutbox")
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	dsn, err := EnsureLocal(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ResetLocal(dir) })
	home := clusterHome(dir)
	if home == dir || !strings.HasPrefix(home, relocationRoot+string(filepath.Separator)) {
		t.Fatalf("cluster home %s, want one under %s", home, relocationRoot)
	}
	if !strings.Contains(logs.String(), "lives in "+home) || !strings.Contains(logs.String(), "mode 0700") {
		t.Fatalf("the move is not logged with its reason:\n%s", logs.String())
	}
	if _, err := os.Stat(filepath.Join(home, "pgdata", "PG_VERSION")); err != nil {
		t.Fatalf("no cluster in %s: %v", home, err)
	}
	conn := connect(t, dsn)
	conn.Close(ctx)

	if err := StopLocal(dir); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	again, err := EnsureLocal(ctx, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	if again != dsn || !strings.Contains(logs.String(), "starting embedded PostgreSQL") {
		t.Fatalf("restart: dsn %s (was %s); log:\n%s", again, dsn, logs.String())
	}
	if err := ResetLocal(dir); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, home} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s survives ResetLocal: %v", p, err)
		}
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
	if _, err := os.Stat(tc.c.dataDir()); err != nil {
		t.Fatal(err)
	}
}

func TestResetLocalRefusesForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "precious")
	if err := os.WriteFile(keep, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ResetLocal(dir); err == nil {
		t.Fatal("ResetLocal deleted a directory it did not create")
	}
	if _, err := EnsureLocal(context.Background(), dir, nil); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("EnsureLocal on a foreign directory: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatal(err)
	}
	if err := ResetLocal(filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("ResetLocal of a missing directory: %v", err)
	}
}

func TestFindBinariesWantsDataDirVersion(t *testing.T) {
	_, err := findBinaries(99)
	if errors.Is(err, errNoBinaries) {
		t.Skip(err)
	}
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 99") {
		t.Fatalf("findBinaries(99) = %v", err)
	}
}
