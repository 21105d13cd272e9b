package pgoutbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is the database a function of this package runs its statements on:
// a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. Pass a transaction to make the
// call part of it (Resolve in the transaction that applies the resolution,
// Lease.Complete with the application's own writes); pass a pool or a
// connection to run it on its own. It is the subset of pgx's methods the
// engine uses, so any value with these three methods will do.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// pgx's pool, connection and transaction are each a DB.
var (
	_ DB = (*pgxpool.Pool)(nil)
	_ DB = (*pgx.Conn)(nil)
	_ DB = pgx.Tx(nil)
)
