package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

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
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, "", &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect: %w", err)}
	}
	return pool, dsn, nil
}
