package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	cpmigrations "github.com/pgoutbox/pgoutbox/controlplane/migrations"
	"github.com/pgoutbox/pgoutbox/migrations"
	projmigrations "github.com/pgoutbox/pgoutbox/projection/migrations"
)

// lines are the migration lines of every database NewDB returns: the
// engine's and both applications' (their tests need their schemas).
var lines = []migrations.Line{migrations.Engine, cpmigrations.Line, projmigrations.Line}

// migrateAll applies every line to dsn's database.
func migrateAll(ctx context.Context, dsn string) error {
	_, err := migrations.UpLines(ctx, dsn, lines...)
	return err
}

// templateLockKey is the advisory lock ("pgoutbox" in ASCII) that serializes
// template creation among every process using the same server.
const templateLockKey int64 = 0x7067_6f75_7462_6f78

var (
	dbSeq atomic.Int64
	// procToken tells apart processes with equal pids (containers) that share
	// a server.
	procToken = func() string {
		b := make([]byte, 3)
		_, _ = rand.Read(b)
		return hex.EncodeToString(b)
	}()
)

// The template this process has verified (or built); later NewDB calls skip
// the lock.
var tpl struct {
	mu   sync.Mutex
	name string
}

// templateName is "pgoutbox_tpl_" and the first 12 hex digits of a SHA-256
// over every line's name and its embedded migration files' names and
// contents: a changed, added or removed migration or line yields a new
// template.
var templateName = sync.OnceValues(func() (string, error) {
	h := sha256.New()
	for _, l := range lines {
		fmt.Fprintf(h, "line\x00%s\x00%s\x00", l.Name, l.VersionTable())
		err := fs.WalkDir(l.FS, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(l.FS, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
			h.Write(b)
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("hash migrations of the %s line: %w", l.Name, err)
		}
	}
	return "pgoutbox_tpl_" + hex.EncodeToString(h.Sum(nil))[:12], nil
})

// NewDB creates a database for tb alone and returns its connection string
// (the AdminDSN role, so a superuser on our own clusters). The database holds
// every embedded migration of every line (the engine's and both
// applications'), is empty otherwise, and is dropped WITH (FORCE)
// when tb's cleanups run, closing whatever connections to it remain.
//
// It is cloned from a template database (CREATE DATABASE ... TEMPLATE), built
// once per server and migration set: its name carries a hash of the embedded
// migration files, and processes racing to build it serialize on an advisory
// lock. The template is left on the server for the next run. NewDB is safe
// for parallel tests; names are pgoutbox_t_<pid>_<random>_<n>. It needs
// PostgreSQL 13 or later.
func NewDB(tb testing.TB) string {
	tb.Helper()
	adminDSN := AdminDSN(tb)
	dsn, drop, err := createDB(adminDSN)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// ExampleDB is NewDB for a runnable example, which has no testing.TB: it
// returns the new database's connection string and a function that drops
// it (call it when the example ends; deferred is fine). It panics when no
// server is available or the database cannot be created, which fails the
// example. Like NewDB it needs Main as the package's TestMain.
func ExampleDB() (dsn string, drop func()) {
	admin.once.Do(resolveAdminOnce)
	if admin.err != nil {
		panic(fmt.Sprintf("pgtest: %v", admin.err))
	}
	dsn, dropErr, err := createDB(admin.dsn)
	if err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	return dsn, func() {
		if err := dropErr(); err != nil {
			panic(fmt.Sprintf("pgtest: %v", err))
		}
	}
}

// createDB clones a new database from the migrated template on adminDSN's
// server and returns its connection string and the function that drops it
// WITH (FORCE).
func createDB(adminDSN string) (dsn string, drop func() error, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tplName, err := ensureTemplate(ctx, adminDSN)
	if err != nil {
		return "", nil, fmt.Errorf("template database: %w", err)
	}
	name := fmt.Sprintf("pgoutbox_t_%d_%s_%d", os.Getpid(), procToken, dbSeq.Add(1))
	if err := adminExec(ctx, adminDSN, "CREATE DATABASE "+ident(name)+" TEMPLATE "+ident(tplName)); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := adminExec(ctx, adminDSN, "DROP DATABASE IF EXISTS "+ident(name)+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return withDatabase(adminDSN, name), drop, nil
}

// NewPool is NewDB plus a pgxpool.Pool on the new database, closed when tb's
// cleanups run (before the database is dropped). It returns the pool and the
// database's connection string.
func NewPool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	dsn := NewDB(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		tb.Fatalf("pgtest: ping new database: %v", err)
	}
	return pool, dsn
}

// ensureTemplate returns the name of the migrated template database, building
// it if this server lacks it. A database of that name that is not marked as a
// template is the remains of a build that was interrupted: it is rebuilt.
func ensureTemplate(ctx context.Context, adminDSN string) (string, error) {
	tpl.mu.Lock()
	defer tpl.mu.Unlock()
	if tpl.name != "" {
		return tpl.name, nil
	}
	name, err := templateName()
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return "", fmt.Errorf("connect as admin: %w", err)
	}
	// Closing the session also releases the advisory lock.
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, templateLockKey); err != nil {
		return "", fmt.Errorf("advisory lock: %w", err)
	}
	var isTemplate bool
	err = conn.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, name).Scan(&isTemplate)
	switch {
	case err == nil && isTemplate:
		// Built by an earlier run or a concurrent process.
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return "", err
	default:
		if err == nil {
			if _, err := conn.Exec(ctx, "DROP DATABASE "+ident(name)+" WITH (FORCE)"); err != nil {
				return "", fmt.Errorf("drop unfinished template %s: %w", name, err)
			}
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident(name)+" TEMPLATE template0 ENCODING 'UTF8'"); err != nil {
			return "", fmt.Errorf("create %s: %w", name, err)
		}
		if err := migrateAll(ctx, withDatabase(adminDSN, name)); err != nil {
			return "", fmt.Errorf("migrate %s: %w", name, err)
		}
		// Marking it a template is what makes it count as built; refusing
		// connections keeps it pristine and clonable.
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident(name)+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false"); err != nil {
			return "", fmt.Errorf("mark %s as template: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, templateLockKey); err != nil {
		return "", fmt.Errorf("advisory unlock: %w", err)
	}
	tpl.name = name
	return name, nil
}

// adminExec runs one statement on a new admin connection.
func adminExec(ctx context.Context, adminDSN, sql string) error {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return fmt.Errorf("connect as admin: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }

// withDatabase returns dsn (a URL or keyword/value connection string)
// pointing at database db instead.
func withDatabase(dsn, db string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		u.RawPath = ""
		return u.String()
	}
	// In keyword/value form the last occurrence of a keyword wins.
	return dsn + " dbname=" + db
}
