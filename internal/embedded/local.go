package embedded

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LocalDatabase is the database whose connection string EnsureLocal returns.
const LocalDatabase = "pgoutbox"

// Files of a persistent (EnsureLocal) cluster directory, besides pgdata and
// postgres.log.
const (
	localMarker   = "README"  // marks the directory as ours (ResetLocal checks it)
	localPortFile = "port"    // the port the cluster listens on, kept across runs
	localLockFile = ".lock"   // serializes EnsureLocal/StopLocal/ResetLocal
	localMovedTo  = "cluster" // when present: the directory that holds pgdata, postgres.log and port
	markerHeading = "pgoutbox embedded PostgreSQL"
)

// relocationRoot is where, run as root, EnsureLocal keeps the cluster of a
// directory that the postgres OS user cannot reach: one subdirectory per
// directory, named by a hash of its absolute path. /var/tmp survives reboots.
var relocationRoot = filepath.Join(string(filepath.Separator)+"var", "tmp", "pgoutbox-embedded")

// EnsureLocal makes sure the persistent embedded cluster in dir is running
// and returns the connection string of its LocalDatabase ("pgoutbox"),
// created if missing. It is what `pgoutbox serve` and `pgoutbox demo` use
// when no DATABASE_URL is given; callers pass "./.pgoutbox".
//
//   - dir/pgdata exists and its server runs: it is reused
//     ("reusing embedded PostgreSQL at ...");
//   - it exists but is stopped: it is started ("starting embedded PostgreSQL at ...");
//   - it does not exist: initdb, then start ("created embedded PostgreSQL at ...").
//
// The server listens on 127.0.0.1 only, with trust authentication for the
// superuser "postgres": any local user can connect, so it is for development
// and demos, not production. It keeps fsync on. Its port is stored in
// dir/port and kept across runs; if another program took it meanwhile, a new
// free port is chosen (and logged). The server keeps running after the
// process exits, which is what makes the next call fast; StopLocal stops it
// and ResetLocal deletes it. Calls on one dir from several processes
// serialize on a lock file in dir.
//
// An existing data directory is served by the binaries of the PostgreSQL
// major version that created it; if only other versions are installed,
// EnsureLocal fails and says so (ResetLocal discards the old cluster).
//
// Run as root, the server runs as the OS user "postgres" (PostgreSQL refuses
// root), which then owns dir. If that user cannot reach dir (typically dir is
// under /root, or a home directory of mode 0700), the cluster itself (pgdata,
// postgres.log, port) lives in a directory of its own under
// /var/tmp/pgoutbox-embedded instead, named by a hash of dir's absolute path;
// dir keeps the marker and a file "cluster" naming that place, so the next
// EnsureLocal, StopLocal and ResetLocal find it. The move is logged once, when
// it happens. log may be nil.
func EnsureLocal(ctx context.Context, dir string, log *slog.Logger) (dsn string, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("embedded PostgreSQL at %s: %w", abs, err)
		}
	}()
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return "", err
	}
	var c *Cluster
	switch err := os.Mkdir(abs, 0o700); {
	case err == nil:
		// Created by this call: do not leave it (or a server) behind if we fail.
		defer func() {
			if dsn != "" {
				return
			}
			if c != nil {
				if running, _ := c.running(context.Background()); running {
					_ = c.stopDetached(context.Background(), "immediate")
				}
			}
			if home := clusterHome(abs); home != abs {
				_ = os.RemoveAll(home)
			}
			_ = os.RemoveAll(abs)
		}()
	case !errors.Is(err, os.ErrExist):
		return "", err
	}
	if !isLocalDir(abs) {
		if entries, _ := os.ReadDir(abs); len(entries) > 0 {
			return "", fmt.Errorf("directory is not empty and was not created by pgoutbox (no %s); refusing to use it", localMarker)
		}
		marker := markerHeading + "\n\nThis directory holds a PostgreSQL cluster created by pgoutbox for development.\n" +
			"pgdata/ is the data directory, postgres.log the server log, port its TCP port on 127.0.0.1.\n" +
			"Stop it with `pgoutbox embedded stop` from the directory that holds this one (elsewhere:\n" +
			"`pgoutbox --data-dir <this directory> embedded stop`); `pgoutbox embedded reset` discards it.\n"
		if err := os.WriteFile(filepath.Join(abs, localMarker), []byte(marker), 0o644); err != nil {
			return "", err
		}
	}
	unlock, err := lockFile(filepath.Join(abs, localLockFile))
	if err != nil {
		return "", err
	}
	defer unlock()

	home := clusterHome(abs)
	dataDir := filepath.Join(home, "pgdata")
	major := initializedMajor(dataDir)
	c, err = Open(ctx, home, major)
	if errors.Is(err, ErrUnreachable) && home == abs {
		reason := err
		if home, err = relocate(abs); err != nil {
			return "", fmt.Errorf("%w; and no place for it under %s: %v", reason, relocationRoot, err)
		}
		log.Info("embedded PostgreSQL for " + abs + " lives in " + home + ": the postgres OS user cannot reach " + abs + blockingParent(abs))
		dataDir = filepath.Join(home, "pgdata")
		major = initializedMajor(dataDir)
		c, err = Open(ctx, home, major)
	}
	if err != nil {
		return "", localHint(err)
	}

	var port int
	var what string
	switch {
	case major == 0:
		// Nothing, or the remains of an initdb that did not finish.
		if err := os.RemoveAll(dataDir); err != nil {
			return "", err
		}
		if err := c.InitDB(ctx, true); err != nil {
			return "", err
		}
		if port, err = startLocal(ctx, c, log); err != nil {
			return "", err
		}
		what = "created"
	default:
		running, err := c.running(ctx)
		if err != nil {
			return "", err
		}
		if running {
			if port, err = c.runningPort(); err != nil {
				return "", fmt.Errorf("read port of running server: %w", err)
			}
			what = "reusing"
		} else {
			if port, err = startLocal(ctx, c, log); err != nil {
				return "", err
			}
			what = "starting"
		}
	}
	if err := ensureDatabase(ctx, port, LocalDatabase); err != nil {
		return "", err
	}
	log.Info(what+" embedded PostgreSQL at "+abs,
		slog.String("addr", "127.0.0.1:"+strconv.Itoa(port)),
		slog.String("version", c.bin.version),
		slog.String("database", LocalDatabase))
	return DSN(port, LocalDatabase), nil
}

// localHint adds what to do when the embedded cluster cannot be had.
func localHint(err error) error {
	switch {
	case errors.Is(err, ErrNoBinaries):
		return fmt.Errorf("%w;\n%s", err, InstallHint("DATABASE_URL", LocalDatabase))
	case errors.Is(err, ErrUnreachable):
		return fmt.Errorf("%w;\nset DATABASE_URL to use an existing PostgreSQL server instead, or run from a directory that OS user postgres can reach", err)
	case errors.Is(err, errWrongVersion):
		return fmt.Errorf("%w;\ninstall that version, or discard the embedded cluster and its data (ResetLocal, i.e. delete the directory) to create a new one, or set DATABASE_URL", err)
	}
	return err
}

// startLocal starts a persistent cluster on its stored port, or on a new
// free port (stored for next time) when that one is taken.
func startLocal(ctx context.Context, c *Cluster, log *slog.Logger) (int, error) {
	portFile := filepath.Join(c.dir, localPortFile)
	for attempt := 1; ; attempt++ {
		stored := IntInFile(portFile)
		port := stored
		if port <= 0 || !PortFree(port) {
			p, err := FreePort()
			if err != nil {
				return 0, err
			}
			port = p
			if stored > 0 {
				log.Warn("embedded PostgreSQL: stored port is in use by another program; moving",
					slog.Int("old_port", stored), slog.Int("new_port", port))
			}
			if err := os.WriteFile(portFile, []byte(strconv.Itoa(port)+"\n"), 0o644); err != nil {
				return 0, err
			}
		}
		err := c.startDetached(ctx, port)
		if err == nil {
			return port, nil
		}
		// Retry only when someone took the port between our check and the
		// server's bind.
		if attempt == 3 || PortFree(port) || ctx.Err() != nil {
			return 0, fmt.Errorf("%w\n%s", err, Tail(c.LogFile(), 15))
		}
	}
}

// ensureDatabase creates database db on our cluster if it is missing.
func ensureDatabase(ctx context.Context, port int, db string) error {
	conn, err := pgx.Connect(ctx, DSN(port, "postgres"))
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, db).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %s: %w", db, err)
	}
	return nil
}

// isLocalDir reports whether dir carries EnsureLocal's marker file.
func isLocalDir(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, localMarker))
	return err == nil && bytes.HasPrefix(b, []byte(markerHeading))
}

// StopLocal stops the embedded cluster in dir (pg_ctl stop -m fast) and
// waits until it has exited. It is a no-op when dir holds no cluster or its
// server is not running.
func StopLocal(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if !isLocalDir(abs) {
		return nil
	}
	unlock, err := lockFile(filepath.Join(abs, localLockFile))
	if err != nil {
		return err
	}
	defer unlock()
	return stopLocal(abs)
}

func stopLocal(abs string) error {
	home := clusterHome(abs)
	major := initializedMajor(filepath.Join(home, "pgdata"))
	if major == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*StartTimeout)
	defer cancel()
	c, err := Open(ctx, home, major)
	if err != nil {
		return fmt.Errorf("stop embedded PostgreSQL at %s: %w", home, err)
	}
	running, err := c.running(ctx)
	if err != nil || !running {
		return err
	}
	if err := c.stopDetached(ctx, "fast"); err != nil {
		return fmt.Errorf("stop embedded PostgreSQL at %s: %w", abs, err)
	}
	return nil
}

// ResetLocal stops the embedded cluster in dir and deletes dir with
// everything in it. A missing dir is not an error; a directory that
// EnsureLocal did not create (no marker file) is refused.
func ResetLocal(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !isLocalDir(abs) {
		return fmt.Errorf("reset embedded PostgreSQL: %s was not created by pgoutbox (no %s); not deleting it",
			abs, localMarker)
	}
	unlock, err := lockFile(filepath.Join(abs, localLockFile))
	if err != nil {
		return err
	}
	defer unlock()
	if err := stopLocal(abs); err != nil {
		return err
	}
	if home := clusterHome(abs); home != abs {
		if err := os.RemoveAll(home); err != nil {
			return err
		}
	}
	return os.RemoveAll(abs)
}

// LocalInitialized reports whether dir holds an embedded cluster that
// EnsureLocal created (its data directory may be in dir or where dir's
// "cluster" file points).
func LocalInitialized(dir string) bool {
	abs, err := filepath.Abs(dir)
	if err != nil || !isLocalDir(abs) {
		return false
	}
	return initializedMajor(filepath.Join(clusterHome(abs), "pgdata")) != 0
}

// clusterHome is the directory that holds the cluster of the embedded
// directory abs: abs itself, or the place its "cluster" file names.
func clusterHome(abs string) string {
	b, err := os.ReadFile(filepath.Join(abs, localMovedTo))
	if err != nil {
		return abs
	}
	if p := strings.TrimSpace(string(b)); filepath.IsAbs(p) {
		return p
	}
	return abs
}

// relocate gives abs a cluster directory under relocationRoot and records
// it in abs, returning its path.
func relocate(abs string) (string, error) {
	sum := sha256.Sum256([]byte(abs))
	home := filepath.Join(relocationRoot, hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(relocationRoot, 0o755); err != nil {
		return "", err
	}
	if err := os.Chmod(relocationRoot, 0o755); err != nil {
		return "", err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", err
	}
	note := "pgoutbox embedded PostgreSQL of " + abs + "\n"
	if err := os.WriteFile(filepath.Join(home, "FOR"), []byte(note), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(abs, localMovedTo), []byte(home+"\n"), 0o644); err != nil {
		return "", err
	}
	return home, nil
}
