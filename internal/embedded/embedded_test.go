package embedded

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// The package's tests need no shared server: each starts its own cluster
// (or none). goleak runs after them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	if _, err := findBinaries(0); errors.Is(err, ErrNoBinaries) {
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
	port := IntInFile(filepath.Join(dir, localPortFile))
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	moved := ensure("starting")
	if moved == first || !strings.Contains(logs.String(), "stored port is in use") {
		t.Fatalf("cluster did not move off a taken port: %s; log:\n%s", moved, logs.String())
	}
	if next := IntInFile(filepath.Join(dir, localPortFile)); next == port {
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
	if _, err := findBinaries(0); errors.Is(err, ErrNoBinaries) {
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
	if errors.Is(err, ErrNoBinaries) {
		t.Skip(err)
	}
	if err == nil || !strings.Contains(err.Error(), "PostgreSQL 99") {
		t.Fatalf("findBinaries(99) = %v", err)
	}
}
