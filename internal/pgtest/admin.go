package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

// Environment variables AdminDSN reads.
const (
	envTestDatabaseURL = "TEST_DATABASE_URL"
	envDatabaseURL     = "DATABASE_URL"
	envForceCluster    = "PGTEST_FORCE_CLUSTER"
)

// tempDirPrefix names throwaway cluster directories under os.TempDir().
const tempDirPrefix = "pgoutbox-pgtest-"

var admin struct {
	once sync.Once
	dsn  string
	err  error
}

// The throwaway cluster this process started, if any; Shutdown removes it.
var throwaway struct {
	mu sync.Mutex
	tc *tempCluster
}

// AdminDSN returns a superuser connection string to the "postgres" database
// of the server the tests use, resolving it once per process, in this order:
//
//  1. $TEST_DATABASE_URL, if set;
//  2. $DATABASE_URL, if set;
//  3. a server answering on 127.0.0.1:5432 to user $PGUSER, "postgres" or
//     "root" (first that connects and may create databases; passwords come
//     from $PGPASSWORD or ~/.pgpass as usual);
//  4. a throwaway cluster started from the installed PostgreSQL binaries in a
//     temporary directory, on a free port of 127.0.0.1, which Main (or
//     Shutdown) stops and deletes.
//
// With $PGTEST_FORCE_CLUSTER set to a true value only step 4 is taken. When
// nothing works AdminDSN fails tb, saying how to install PostgreSQL or point
// at a server; the failure is remembered, so every later call fails alike.
func AdminDSN(tb testing.TB) string {
	tb.Helper()
	admin.once.Do(resolveAdminOnce)
	if admin.err != nil {
		tb.Fatalf("pgtest: %v", admin.err)
	}
	return admin.dsn
}

// resolveAdminOnce fills admin; it runs under admin.once.
func resolveAdminOnce() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin.dsn, admin.err = resolveAdmin(ctx)
}

func forceCluster() bool {
	v, _ := strconv.ParseBool(os.Getenv(envForceCluster))
	return v
}

func resolveAdmin(ctx context.Context) (string, error) {
	if !forceCluster() {
		for _, name := range []string{envTestDatabaseURL, envDatabaseURL} {
			if v := os.Getenv(name); v != "" {
				return v, nil
			}
		}
		if dsn, ok := probeDefaultServer(ctx); ok {
			return dsn, nil
		}
	}
	tc, err := startTempCluster(ctx)
	if err != nil {
		if errors.Is(err, embedded.ErrNoBinaries) {
			return "", fmt.Errorf("no server on 127.0.0.1:5432 and %v;\n%s", err, embedded.InstallHint(envTestDatabaseURL, "postgres"))
		}
		if errors.Is(err, embedded.ErrUnreachable) {
			return "", fmt.Errorf("start a throwaway PostgreSQL cluster: %w;\nset TMPDIR to a directory it can reach (e.g. /tmp), or set %s to a server", err, envTestDatabaseURL)
		}
		return "", fmt.Errorf("start a throwaway PostgreSQL cluster: %w", err)
	}
	throwaway.mu.Lock()
	throwaway.tc = tc
	throwaway.mu.Unlock()
	return tc.dsn("postgres"), nil
}

// probeDefaultServer looks for a usable server on 127.0.0.1:5432.
func probeDefaultServer(ctx context.Context) (string, bool) {
	c, err := net.DialTimeout("tcp", "127.0.0.1:5432", time.Second)
	if err != nil {
		return "", false
	}
	c.Close()
	var users []string
	for _, u := range []string{os.Getenv("PGUSER"), "postgres", "root"} {
		if u != "" && !slices.Contains(users, u) {
			users = append(users, u)
		}
	}
	for _, u := range users {
		dsn := "postgres://" + url.PathEscape(u) + "@127.0.0.1:5432/postgres?sslmode=disable"
		if canCreateDatabases(ctx, dsn) {
			return dsn, true
		}
	}
	return "", false
}

func canCreateDatabases(ctx context.Context, dsn string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var ok bool
	err = conn.QueryRow(ctx, `SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user`).Scan(&ok)
	return err == nil && ok
}

// tempCluster is a throwaway cluster: a temporary directory holding the data
// directory, the server log and an "owner" file with our pid, served by an
// attached postmaster.
type tempCluster struct {
	c    *embedded.Cluster
	pm   *embedded.Postmaster
	port int
}

func (tc *tempCluster) dsn(db string) string { return embedded.DSN(tc.port, db) }

// startTempCluster creates, initializes and starts a throwaway cluster in a
// new directory under os.TempDir(). First it deletes the directories of
// throwaway clusters whose owning process died without cleaning up.
func startTempCluster(ctx context.Context) (_ *tempCluster, err error) {
	sweepTempClusters()
	dir, err := os.MkdirTemp("", tempDirPrefix)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, err
	}
	c, err := embedded.Open(ctx, dir, 0)
	if err != nil {
		return nil, err
	}
	if err := c.InitDB(ctx, false); err != nil {
		return nil, err
	}
	// A free port can be taken between our probe and the server's bind:
	// try a few.
	for attempt := 1; ; attempt++ {
		port, perr := embedded.FreePort()
		if perr != nil {
			return nil, perr
		}
		pm, serr := c.StartAttached(ctx, port)
		if serr == nil {
			return &tempCluster{c: c, pm: pm, port: port}, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, serr
		}
	}
}

// stop stops the server and deletes the directory.
func (tc *tempCluster) stop() error {
	err := tc.pm.Stop()
	if rerr := os.RemoveAll(tc.c.Dir()); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// sweepTempClusters deletes throwaway cluster directories whose owner
// process and postmaster are both gone (a test binary killed before Main's
// cleanup ran; on Linux its postmaster died with it). Best effort.
func sweepTempClusters() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempDirPrefix+"*"))
	for _, dir := range dirs {
		if embedded.IntInFile(filepath.Join(dir, "owner")) <= 0 { // being created, or not ours
			continue
		}
		if embedded.ProcessAlive(embedded.IntInFile(filepath.Join(dir, "owner"))) {
			continue
		}
		if pid := embedded.IntInFile(filepath.Join(dir, "pgdata", "postmaster.pid")); pid > 0 && embedded.ProcessAlive(pid) {
			continue
		}
		_ = os.RemoveAll(dir)
	}
}

// Shutdown stops and deletes the throwaway cluster this process started, if
// any. It is idempotent; Main calls it. After it, DSNs from AdminDSN and
// NewDB that pointed at that cluster no longer work.
func Shutdown() error {
	throwaway.mu.Lock()
	tc := throwaway.tc
	throwaway.tc = nil
	throwaway.mu.Unlock()
	if tc == nil {
		return nil
	}
	if err := tc.stop(); err != nil {
		return fmt.Errorf("pgtest: stop throwaway cluster: %w", err)
	}
	return nil
}

// Main runs the tests, then stops and deletes the throwaway cluster this
// process started (if any), then, if everything passed, runs each of after
// (for example a goroutine-leak check) and exits with the tests' exit code,
// or 1 if the cleanup or a check failed. Use it as the whole of TestMain:
//
//	func TestMain(m *testing.M) {
//		pgtest.Main(m, func() error { return goleak.Find() })
//	}
//
// The checks run after the cluster is stopped, so its goroutines never count
// as leaks.
func Main(m *testing.M, after ...func() error) {
	code := m.Run()
	if err := Shutdown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 {
		for _, check := range after {
			if err := check(); err != nil {
				fmt.Fprintf(os.Stderr, "pgtest.Main: check after tests failed: %v\n", err)
				code = 1
			}
		}
	}
	os.Exit(code)
}
