// Package migrations holds the engine's numbered SQL migrations, embedded in
// the binary, and applies them with goose.
//
// Migrations come in lines, one per owner, each with its own goose version
// table: the engine's line ([Engine], schema pgoutbox) lives here; the
// applications own theirs (controlplane/migrations, projection/migrations),
// and each of those needs the engine's line applied first. [Up] applies the
// engine's line only, so a library user gets the pgoutbox schema and nothing
// else; [UpLines] applies several lines in order (`pgoutbox migrate` applies
// the engine's and both applications').
//
// Until the split into lines, one sequence (versions 1 to 9, recorded in
// pgoutbox.goose_db_version) created every schema. The first run of
// [UpLines], [Up] or [ListLines] on such a database moves the records of the
// applications' versions (3: projection; 4 and 9: control plane) into their
// lines' version tables, so nothing is applied twice and no manual step is
// needed. The engine's line never uses those versions.
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
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib" // also registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed [0-9]*.sql
var files embed.FS

// Line is one owner's sequence of numbered goose SQL migrations, recorded in
// a version table of its own, Schema.goose_db_version.
type Line struct {
	// Name identifies the line in listings: "engine", "controlplane",
	// "projection".
	Name string
	// Schema holds the line's version table; it is created, when missing,
	// before the line runs.
	Schema string
	// FS holds the line's migration files (NNNNN_name.sql) at its root.
	FS fs.FS
}

// VersionTable is the table in which goose records the line's applied
// versions: Schema.goose_db_version.
func (l Line) VersionTable() string { return l.Schema + ".goose_db_version" }

// Engine is the engine's line: the schema pgoutbox, recorded in
// pgoutbox.goose_db_version ([VersionTable]).
var Engine = Line{Name: "engine", Schema: "pgoutbox", FS: files}

// VersionTable is the table in which goose records the engine line's applied
// versions. Before the split into lines it recorded every version.
const VersionTable = "pgoutbox.goose_db_version"

// FS returns the engine line's embedded migration files.
func FS() fs.FS { return files }

// legacyOwners maps each version of the former single line that is not the
// engine's to the schema of the line that owns it now (whose version table
// is schema.goose_db_version). The engine's line must never use these
// versions: on a database migrated by the single line they mark the
// records still to be moved.
var legacyOwners = map[int64]string{
	3: "storage_documents", // projection/migrations/00003_projection.sql
	4: "control_plane",     // controlplane/migrations/00004_control_plane.sql
	9: "control_plane",     // controlplane/migrations/00009_control_plane_replay.sql
}

// Status is one migration's state.
type Status struct {
	// Line is the name of the migration's line ("engine", ...).
	Line string `json:"line"`
	// Version is the number the file name starts with.
	Version int64 `json:"version"`
	// Source is the file's path in its line's FS.
	Source string `json:"source"`
	// Applied tells whether the line's version table records it.
	Applied bool `json:"applied"`
	// AppliedAt is RFC 3339, empty when pending.
	AppliedAt string `json:"applied_at,omitempty"`
}

func provider(db *sql.DB, l Line) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, l.FS,
		goose.WithSessionLocker(locker),
		goose.WithTableName(l.VersionTable()),
	)
}

func open(dsn string) (*sql.DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("migrations: open database: %w", err)
	}
	return db, nil
}

// schemaLock serializes the creation of the lines' schemas and the move of
// the single line's records.
const schemaLock = `SELECT pg_advisory_xact_lock(hashtext('pgoutbox.migrations.schema'))`

// ensureSchema creates the schema holding a line's version table; goose
// itself does not create schemas. CREATE SCHEMA IF NOT EXISTS is not safe
// against a concurrent twin, so it runs under a transaction-scoped advisory
// lock.
func ensureSchema(ctx context.Context, db *sql.DB, schema string) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, schemaLock); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("migrations: create schema %s: %w", schema, err)
	}
	return tx.Commit()
}

// splitLegacy moves the records of the applications' versions out of the
// engine's version table, where the former single line kept them, into their
// lines' version tables (created as goose creates them, with the version 0
// row), keeping their order, state and time. It does nothing on a database
// that holds no such record, and it moves all of them or none.
func splitLegacy(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrations: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, schemaLock); err != nil {
		return fmt.Errorf("migrations: lock: %w", err)
	}
	var exists bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, VersionTable).Scan(&exists); err != nil {
		return fmt.Errorf("migrations: split lines: %w", err)
	}
	if !exists {
		return nil
	}
	bySchema := map[string][]int64{}
	for v, schema := range legacyOwners {
		bySchema[schema] = append(bySchema[schema], v)
	}
	for _, schema := range slices.Sorted(maps.Keys(bySchema)) {
		versions := bySchema[schema]
		var found bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT FROM `+VersionTable+` WHERE version_id = ANY ($1))`,
			versions).Scan(&found); err != nil {
			return fmt.Errorf("migrations: split lines: %w", err)
		}
		if !found {
			continue
		}
		if err := moveLegacy(ctx, tx, schema, versions); err != nil {
			return fmt.Errorf("migrations: move versions %v to %s.goose_db_version: %w", versions, schema, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrations: split lines: %w", err)
	}
	return nil
}

// moveLegacy moves the records of versions from the engine's version table to
// schema.goose_db_version, creating it when missing.
func moveLegacy(ctx context.Context, tx *sql.Tx, schema string, versions []int64) error {
	table := pgx.Identifier{schema, "goose_db_version"}.Sanitize()
	var missing bool
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NULL`, table).Scan(&missing); err != nil {
		return err
	}
	if missing {
		// goose's own table (its PostgreSQL dialect) and initial row.
		stmts := []string{
			`CREATE SCHEMA IF NOT EXISTS ` + pgx.Identifier{schema}.Sanitize(),
			`CREATE TABLE ` + table + ` (
		id integer PRIMARY KEY GENERATED BY DEFAULT AS IDENTITY,
		version_id bigint NOT NULL,
		is_applied boolean NOT NULL,
		tstamp timestamp NOT NULL DEFAULT now()
	)`,
			`INSERT INTO ` + table + ` (version_id, is_applied, tstamp)
		SELECT 0, true, coalesce((SELECT min(tstamp) FROM ` + VersionTable + ` WHERE version_id = 0), now())`,
		}
		for _, s := range stmts {
			if _, err := tx.ExecContext(ctx, s); err != nil {
				return err
			}
		}
	}
	_, err := tx.ExecContext(ctx, `WITH moved AS (
		DELETE FROM `+VersionTable+` WHERE version_id = ANY ($1) RETURNING id, version_id, is_applied, tstamp
	)
	INSERT INTO `+table+` (version_id, is_applied, tstamp)
	SELECT version_id, is_applied, tstamp FROM moved ORDER BY id`, versions)
	return err
}

// withLines opens dsn, moves the single line's records when the database
// has them, and runs fn with a goose provider for each line, in order, after
// making sure the line's schema exists.
func withLines(ctx context.Context, dsn string, lines []Line, fn func(Line, *goose.Provider) error) error {
	db, err := open(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := splitLegacy(ctx, db); err != nil {
		return err
	}
	for _, l := range lines {
		if err := ensureSchema(ctx, db, l.Schema); err != nil {
			return err
		}
		p, err := provider(db, l)
		if err != nil {
			return fmt.Errorf("migrations: %s line: %w", l.Name, err)
		}
		if err := fn(l, p); err != nil {
			return err
		}
	}
	return nil
}

// Up applies every pending migration of the engine's line and returns the
// versions it applied (none when the database is current). It creates no
// application schema.
func Up(ctx context.Context, dsn string) ([]int64, error) {
	applied, err := UpLines(ctx, dsn, Engine)
	var out []int64
	for _, s := range applied {
		out = append(out, s.Version)
	}
	return out, err
}

// UpLines applies every pending migration of each line, line after line in
// the order given (the engine's first: the applications' lines need it), and
// returns the migrations it applied (none when the database is current).
func UpLines(ctx context.Context, dsn string, lines ...Line) ([]Status, error) {
	var out []Status
	err := withLines(ctx, dsn, lines, func(l Line, p *goose.Provider) error {
		res, err := p.Up(ctx)
		for _, r := range res {
			out = append(out, Status{Line: l.Name, Version: r.Source.Version, Source: r.Source.Path, Applied: true})
		}
		if err != nil {
			return fmt.Errorf("migrations: %s line: up: %w", l.Name, err)
		}
		return nil
	})
	return out, err
}

// List reports every migration of the engine's line and whether it is
// applied.
func List(ctx context.Context, dsn string) ([]Status, error) {
	return ListLines(ctx, dsn, Engine)
}

// ListLines reports every migration of each line, in the order given, and
// whether it is applied. Like [UpLines] it creates the lines' schemas and
// version tables when missing.
func ListLines(ctx context.Context, dsn string, lines ...Line) ([]Status, error) {
	var out []Status
	err := withLines(ctx, dsn, lines, func(l Line, p *goose.Provider) error {
		st, err := p.Status(ctx)
		if err != nil {
			return fmt.Errorf("migrations: %s line: status: %w", l.Name, err)
		}
		for _, s := range st {
			ms := Status{Line: l.Name, Version: s.Source.Version, Source: s.Source.Path, Applied: s.State == goose.StateApplied}
			if ms.Applied {
				ms.AppliedAt = s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
			}
			out = append(out, ms)
		}
		return nil
	})
	return out, err
}

// Pending reports whether dsn's database lacks a migration of the engine's
// line. See [PendingLines].
func Pending(ctx context.Context, dsn string) (bool, error) {
	return PendingLines(ctx, dsn, Engine)
}

// PendingLines reports whether dsn's database lacks a migration of one of
// lines. Unlike [UpLines] it writes nothing (the records of the former single
// line count for the lines that own them), takes no session advisory lock
// and uses pgx's exec query mode (no named prepared statements), so it may
// run through a transaction-pooling proxy (docs/poolers.md), where UpLines
// must not: the lock would stay with whichever server connection took it.
func PendingLines(ctx context.Context, dsn string, lines ...Line) (bool, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return false, fmt.Errorf("migrations: %w", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	for _, l := range lines {
		want, err := sourceVersions(l)
		if err != nil {
			return false, err
		}
		have, err := appliedVersions(ctx, db, l)
		if err != nil {
			return false, fmt.Errorf("migrations: pending: %w", err)
		}
		for _, v := range want {
			if !have[v] {
				return true, nil
			}
		}
	}
	return false, nil
}

// sourceVersions lists the versions of l's migration files.
func sourceVersions(l Line) ([]int64, error) {
	names, err := fs.Glob(l.FS, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("migrations: %s line: %w", l.Name, err)
	}
	var out []int64
	for _, n := range names {
		v, err := goose.NumericComponent(n)
		if err != nil {
			return nil, fmt.Errorf("migrations: %s line: %s: %w", l.Name, n, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// appliedVersions reads the versions recorded as applied for l: in its
// version table, and, for an application's line, the records the former
// single line left in the engine's. Missing tables record nothing.
func appliedVersions(ctx context.Context, db *sql.DB, l Line) (map[int64]bool, error) {
	have := map[int64]bool{}
	read := func(table string, only []int64) error {
		var exists bool
		if err := db.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return nil
		}
		// goose keeps the latest row of a version as its state.
		q := `SELECT DISTINCT ON (version_id) version_id, is_applied FROM ` + table + `
			WHERE ($1::bigint[] IS NULL OR version_id = ANY ($1)) ORDER BY version_id, id DESC`
		rows, err := db.QueryContext(ctx, q, only)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v int64
			var applied bool
			if err := rows.Scan(&v, &applied); err != nil {
				return err
			}
			if applied {
				have[v] = true
			}
		}
		return rows.Err()
	}
	if err := read(pgx.Identifier{l.Schema, "goose_db_version"}.Sanitize(), nil); err != nil {
		return nil, err
	}
	var legacy []int64
	for v, schema := range legacyOwners {
		if schema == l.Schema {
			legacy = append(legacy, v)
		}
	}
	if len(legacy) > 0 {
		if err := read(VersionTable, legacy); err != nil {
			return nil, err
		}
	}
	return have, nil
}
