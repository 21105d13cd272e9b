package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"

	cpmigrations "github.com/pgoutbox/pgoutbox/controlplane/migrations"
	"github.com/pgoutbox/pgoutbox/internal/embedded"
	"github.com/pgoutbox/pgoutbox/migrations"
	projmigrations "github.com/pgoutbox/pgoutbox/projection/migrations"
)

// migrationLines are the migration lines migrate, serve, work and the other
// commands that migrate apply, in order: the engine's, then those of the
// applications the binary runs (the control plane and the projection).
var migrationLines = []migrations.Line{migrations.Engine, cpmigrations.Line, projmigrations.Line}

// PoolMaxConnsDefault is the connection pool size of serve, work and the
// commands (PGOUTBOX_DB_MAX_CONNS; a pool_max_conns in DATABASE_URL wins).
// Deliveries of the projection hold a connection while they call a target,
// so the pool must exceed the workers' concurrency.
const PoolMaxConnsDefault = 24

// dsn returns DATABASE_URL, or starts (or reuses) the embedded PostgreSQL.
func (g *globals) dsn(ctx context.Context) (string, error) {
	if g.databaseURL != "" {
		return g.databaseURL, nil
	}
	dsn, err := embedded.EnsureLocal(ctx, g.dataDir, g.logger())
	if err != nil {
		return "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("embedded PostgreSQL: %w", err)}
	}
	return dsn, nil
}

// open resolves the database and returns a pool; it applies pending
// migrations when migrate is true. When DATABASE_URL goes through a
// transaction-pooling proxy (docs/poolers.md) and does not choose a pgx
// query mode, the pool uses the exec mode (no named prepared statements),
// and migrations run on --session-database-url: without it, open fails when
// a migration is pending.
func (g *globals) open(ctx context.Context, migrate bool) (*pgxpool.Pool, string, error) {
	dsn, err := g.dsn(ctx)
	if err != nil {
		return nil, "", err
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("DATABASE_URL: %w", err)}
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pcfg.MaxConns = int32(envInt("PGOUTBOX_DB_MAX_CONNS", PoolMaxConnsDefault))
	}
	pool, err := connectPool(ctx, pcfg)
	if err != nil {
		return nil, "", err
	}
	g.pooled, err = pgoutbox.BehindTransactionPooler(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	if g.pooled && !strings.Contains(dsn, "default_query_exec_mode") {
		pool.Close()
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		if pool, err = connectPool(ctx, pcfg); err != nil {
			return nil, "", err
		}
		g.logger().Info("DATABASE_URL goes through a transaction-pooling proxy: using pgx's exec query mode (docs/poolers.md)")
	}
	if migrate {
		if err := g.migrate(ctx, dsn, nil); err != nil {
			pool.Close()
			return nil, "", err
		}
	}
	return pool, dsn, nil
}

func connectPool(ctx context.Context, pcfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	return pool, nil
}

// errMigrateThroughPooler: migrations hold a session advisory lock.
var errMigrateThroughPooler = errors.New("DATABASE_URL goes through a transaction-pooling proxy and migrations are pending; " +
	"they hold a session advisory lock, which needs a session of its own: set PGOUTBOX_SESSION_DATABASE_URL " +
	"(--session-database-url) to the database's direct address, or run `pgoutbox migrate` with DATABASE_URL " +
	"set to it (docs/poolers.md)")

// migrate applies the pending migrations of migrationLines to dsn's
// database (open has set g.pooled): on the session URL when one is given;
// through a transaction pooler without one only when nothing is pending.
// applied receives the migrations applied.
func (g *globals) migrate(ctx context.Context, dsn string, applied *[]migrations.Status) error {
	target := dsn
	switch {
	case g.sessionURL != "":
		target = g.sessionURL
	case g.pooled:
		pending, err := migrations.PendingLines(ctx, dsn, migrationLines...)
		if err != nil {
			return &ExitError{Code: ExitCouldNotRun, Err: err}
		}
		if pending {
			return &ExitError{Code: ExitCouldNotRun, Err: errMigrateThroughPooler}
		}
		return nil
	}
	done, err := migrations.UpLines(ctx, target, migrationLines...)
	if err != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	if applied != nil {
		*applied = done
	}
	return nil
}
