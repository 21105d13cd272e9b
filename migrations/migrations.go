// Package migrations holds pgoutbox's numbered SQL migrations, embedded in the
// binary, and applies them with goose.
//
// Applying is idempotent (a second run is a no-op) and safe under concurrency:
// goose takes a PostgreSQL session advisory lock for the duration of a run, so
// two processes migrating at once serialize instead of racing.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// VersionTable is the table in which goose records applied versions.
const VersionTable = "pgoutbox.goose_db_version"

// FS returns the embedded migration files.
func FS() fs.FS { return files }

// Status is one migration's state.
type Status struct {
	Version int64  `json:"version"`
	Source  string `json:"source"`
	Applied bool   `json:"applied"`
	// AppliedAt is RFC 3339, empty when pending.
	AppliedAt string `json:"applied_at,omitempty"`
}

func provider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker),
		goose.WithTableName(VersionTable),
	)
}

func open(dsn string) (*sql.DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: open database: %w", err)
	}
	return db, nil
}

// ensureSchema creates the schema holding goose's version table; goose itself
// does not create schemas. CREATE SCHEMA IF NOT EXISTS is not safe against a
// concurrent twin, so it runs under a transaction-scoped advisory lock.
func ensureSchema(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('pgoutbox.migrations.schema'))`); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS pgoutbox`); err != nil {
		return fmt.Errorf("migrations: create schema pgoutbox: %w", err)
	}
	return tx.Commit()
}

// withProvider opens dsn, makes sure the version table's schema exists and
// runs fn with a goose provider.
func withProvider(ctx context.Context, dsn string, fn func(*goose.Provider) error) error {
	db, err := open(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := ensureSchema(ctx, db); err != nil {
		return err
	}
	p, err := provider(db)
	if err != nil {
		return err
	}
	return fn(p)
}

// Up applies every pending migration and returns the versions it applied
// (none when the database is current).
func Up(ctx context.Context, dsn string) ([]int64, error) {
	var out []int64
	err := withProvider(ctx, dsn, func(p *goose.Provider) error {
		res, err := p.Up(ctx)
		if err != nil {
			return fmt.Errorf("migrations: up: %w", err)
		}
		for _, r := range res {
			out = append(out, r.Source.Version)
		}
		return nil
	})
	return out, err
}

// List reports every known migration and whether it is applied.
func List(ctx context.Context, dsn string) ([]Status, error) {
	var out []Status
	err := withProvider(ctx, dsn, func(p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migrations: status: %w", err)
		}
		for _, s := range st {
			ms := Status{Version: s.Source.Version, Source: s.Source.Path, Applied: s.State == goose.StateApplied}
			if ms.Applied {
				ms.AppliedAt = s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
			}
			out = append(out, ms)
		}
		return nil
	})
	return out, err
}

// Pending reports whether dsn's database lacks a migration. Unlike Up it
// writes nothing, takes no session advisory lock and uses pgx's exec query mode (no named
// prepared statements), so it may run through a transaction-pooling proxy
// (docs/poolers.md), where Up must not: the lock would stay with whichever
// server connection took it.
func Pending(ctx context.Context, dsn string) (bool, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, fmt.Errorf("migrations: %w", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	// Nothing is written: without the version table everything is pending.
	var missing bool
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NULL`, VersionTable).Scan(&missing); err != nil {
		return false, fmt.Errorf("migrations: pending: %w", err)
	}
	if missing {
		return true, nil
	}
	p, err := provider(db)
	if err != nil {
		return false, err
	}
	pending, err := p.HasPending(ctx)
	if err != nil {
		return false, fmt.Errorf("migrations: pending: %w", err)
	}
	return pending, nil
}
