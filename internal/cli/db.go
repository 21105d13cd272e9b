package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

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
	dsn, err := pgtest.EnsureLocal(ctx, g.dataDir, g.logger())
	if err != nil {
		return "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("embedded PostgreSQL: %w", err)}
	}
	return dsn, nil
}

// open resolves the database, applies pending migrations when migrate is
// true, and returns a pool.
func (g *globals) open(ctx context.Context, migrate bool) (*pgxpool.Pool, string, error) {
	dsn, err := g.dsn(ctx)
	if err != nil {
		return nil, "", err
	}
	if migrate {
		if _, err := migrations.Up(ctx, dsn); err != nil {
			return nil, "", &ExitError{Code: ExitCouldNotRun, Err: err}
		}
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("DATABASE_URL: %w", err)}
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		pcfg.MaxConns = int32(envInt("PGOUTBOX_DB_MAX_CONNS", PoolMaxConnsDefault))
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	return pool, dsn, nil
}
