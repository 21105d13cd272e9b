package pgtest

// A cluster owned by one test, which the test may stop, crash and restart
// (the reliability suite's "restart PostgreSQL in immediate mode" scenario).
// The shared server of AdminDSN must never be restarted by a test: other
// tests, in this process and others, use it.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

// Shutdown modes of [Cluster.Stop] and [Cluster.Restart], as pg_ctl names them.
const (
	// StopFast disconnects every client, rolls back open transactions and
	// writes a shutdown checkpoint (SIGINT to the postmaster).
	StopFast = "fast"
	// StopImmediate aborts every server process without a checkpoint, like a
	// crash: the next start runs crash recovery from the WAL (SIGQUIT to the
	// postmaster).
	StopImmediate = "immediate"
)

// Cluster is a PostgreSQL cluster of its own for one test: created with
// initdb in a new temporary directory, served by a postmaster that is a child
// of the test process, on a port that stays the same across restarts. It is
// stopped and deleted when the test's cleanups run.
//
// Unlike the throwaway cluster behind AdminDSN, a Cluster keeps
// synchronous_commit on: a transaction whose COMMIT returned survives an
// immediate stop (crash recovery replays it). fsync is off, which protects
// against a server crash but not an operating-system crash; that is enough
// for tests that kill the server, never the machine.
type Cluster struct {
	c    *embedded.Cluster
	port int

	mu sync.Mutex
	pm *embedded.Postmaster // nil while stopped
}

// NewCluster creates and starts a cluster for tb. conf lines are appended to
// postgresql.conf (e.g. "max_connections = 20"). It fails tb when the
// PostgreSQL binaries are missing; it needs no server to be running.
func NewCluster(tb testing.TB, conf ...string) *Cluster {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sweepTempClusters()
	dir, err := os.MkdirTemp("", tempDirPrefix)
	if err != nil {
		tb.Fatalf("pgtest: cluster directory: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	// The owner file lets a later run delete the directory if we die before
	// our cleanups run (sweepTempClusters).
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	c, err := embedded.Open(ctx, dir, 0)
	if err != nil {
		tb.Fatalf("pgtest: cluster: %v", err)
	}
	if err := c.InitDB(ctx, true); err != nil {
		tb.Fatalf("pgtest: initdb: %v", err)
	}
	extra := "\n# pgtest.NewCluster\nfsync = off\n"
	for _, line := range conf {
		extra += line + "\n"
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	_, werr := f.WriteString(extra)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		tb.Fatalf("pgtest: postgresql.conf: %v", werr)
	}
	cl := &Cluster{c: c}
	for attempt := 1; ; attempt++ {
		port, err := embedded.FreePort()
		if err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		pm, err := c.StartAttached(ctx, port)
		if err == nil {
			cl.port, cl.pm = port, pm
			break
		}
		if attempt == 3 {
			tb.Fatalf("pgtest: start cluster: %v", err)
		}
	}
	// Registered after the directory's removal, so it runs before it.
	tb.Cleanup(func() {
		if err := cl.Stop(StopFast); err != nil {
			tb.Errorf("pgtest: stop cluster: %v", err)
		}
	})
	return cl
}

// Port is the TCP port the cluster listens on (127.0.0.1), the same across
// restarts.
func (cl *Cluster) Port() int { return cl.port }

// DSN is the superuser connection string of database db.
func (cl *Cluster) DSN(db string) string { return embedded.DSN(cl.port, db) }

// LogFile is the path of the server log, for failure messages.
func (cl *Cluster) LogFile() string { return cl.c.LogFile() }

// NewDB creates a database on the cluster holding every embedded migration
// and returns its connection string. The database goes away with the
// cluster.
func (cl *Cluster) NewDB(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("pgoutbox_c_%d", dbSeq.Add(1))
	if err := adminExec(ctx, cl.DSN("postgres"), "CREATE DATABASE "+ident(name)); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	dsn := cl.DSN(name)
	if err := migrateAll(ctx, dsn); err != nil {
		tb.Fatalf("pgtest: migrate %s: %v", name, err)
	}
	return dsn
}

// Running reports whether the postmaster is up.
func (cl *Cluster) Running() bool {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.pm != nil
}

// Stop stops the server in mode StopFast or StopImmediate and waits until
// the postmaster has exited. Stopping a stopped cluster does nothing.
func (cl *Cluster) Stop(mode string) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	pm := cl.pm
	if pm == nil {
		return nil
	}
	cl.pm = nil
	switch mode {
	case StopFast:
		return pm.Stop()
	case StopImmediate:
		if err := pm.StopImmediate(); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		return nil
	default:
		cl.pm = pm
		return fmt.Errorf("pgtest: unknown shutdown mode %q (want %q or %q)", mode, StopFast, StopImmediate)
	}
}

// Start starts a stopped cluster on its port and waits until it accepts
// connections (after crash recovery, when the last stop was immediate).
func (cl *Cluster) Start(ctx context.Context) error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.pm != nil {
		return nil
	}
	pm, err := cl.c.StartAttached(ctx, cl.port)
	if err != nil {
		return fmt.Errorf("pgtest: start cluster: %w", err)
	}
	cl.pm = pm
	return nil
}

// RestartTiming is how long the parts of a restart took.
type RestartTiming struct {
	// Stop is from the shutdown signal to the postmaster's exit.
	Stop time.Duration
	// Start is from the new postmaster's launch to the first accepted
	// connection (including crash recovery).
	Start time.Duration
}

// Restart stops the server in mode and starts it again on the same port.
func (cl *Cluster) Restart(ctx context.Context, mode string) (RestartTiming, error) {
	var rt RestartTiming
	t0 := time.Now()
	if err := cl.Stop(mode); err != nil {
		return rt, err
	}
	rt.Stop = time.Since(t0)
	t1 := time.Now()
	err := cl.Start(ctx)
	rt.Start = time.Since(t1)
	return rt, err
}
