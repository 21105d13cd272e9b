package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Behind a transaction-pooling proxy (docs/poolers.md): PgBouncer in
// pool_mode=transaction, Supabase's and Neon's poolers, RDS Proxy. There a
// client connection is a session only for the length of a transaction, so
// LISTEN cannot work and named prepared statements (pgx's default statement
// cache) cannot be routed by PgBouncer before 1.21. Everything else the
// engine does is a single statement or a transaction (row-lock leases hold
// their transaction open; the projection's advisory locks are
// transaction-scoped), and works through one.

// probeTimeout bounds the transaction-pooler probe at Start.
const probeTimeout = 10 * time.Second

// probeConn is a client connection the probe can run statements and open a
// transaction on: a *pgx.Conn or a *pgxpool.Conn.
type probeConn interface {
	store.DBTX
	Begin(ctx context.Context) (pgx.Tx, error)
}

// transactionPooled reports whether a and b, two client connections to the
// same endpoint, are multiplexed over server connections per transaction. On
// PostgreSQL (or a session-mode pooler) each client connection keeps one
// backend for its whole life, so neither can happen: b's transaction runs on
// the backend a's statement has just released (PgBouncer reuses the most
// recently released server connection first), or a's next statement runs
// on another backend than its first.
func transactionPooled(ctx context.Context, a, b probeConn) (bool, error) {
	first, err := store.BackendPID(ctx, a)
	if err != nil {
		return false, err
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	inTx, err := store.BackendPID(ctx, tx)
	if err != nil {
		return false, err
	}
	if inTx == first {
		return true, nil
	}
	// b holds one server connection: with a pool of one a would wait for
	// it, so a's second statement runs only when there were two.
	again, err := store.BackendPID(ctx, a)
	if err != nil {
		return false, err
	}
	return again != first, nil
}

// BehindTransactionPooler reports whether the connections of pool go
// through a transaction-pooling proxy (PgBouncer in pool_mode=transaction,
// Supabase's or Neon's pooler, RDS Proxy): it runs three statements on two
// of the pool's connections, one in a transaction, and compares the backends
// that ran them (docs/poolers.md). It answers false when it cannot tell: a
// pool of at most one connection. Client.Start runs it for a client with
// queues.
func BehindTransactionPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	if pool.Config().MaxConns < 2 {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	return transactionPooled(ctx, a, b)
}

// sessionPooled probes the endpoint of cfg with two new connections.
func sessionPooled(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var conns [2]*pgx.Conn
	for i := range conns {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return false, err
		}
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		conns[i] = conn
	}
	return transactionPooled(ctx, conns[0], conns[1])
}

// ErrPreparedStatementsThroughPooler is returned by Start when the pool
// goes through a transaction-pooling proxy in a query mode that needs
// protocol-level prepared statements across transactions.
var ErrPreparedStatementsThroughPooler = errors.New("pgoutbox: the pool goes through a transaction-pooling proxy, " +
	"which cannot route the named prepared statements of its query mode")

// checkPooler runs at Start for a client with queues: it detects a
// transaction-pooling proxy in front of the pool, refuses what cannot work
// through one, and returns the configuration of the listener's session
// connection (nil: no listener, the claim loops poll).
func (c *Client) checkPooler(ctx context.Context) (*pgx.ConnConfig, error) {
	pooled, err := BehindTransactionPooler(ctx, c.pool)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c.log.Warn("could not check whether the pool goes through a transaction-pooling proxy; assuming it does not", "err", err)
	}
	if pooled {
		switch mode := c.pool.Config().ConnConfig.DefaultQueryExecMode; mode {
		case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec:
			return nil, fmt.Errorf("%w (pgx query mode %q): add default_query_exec_mode=exec to its connection string, "+
				"or set ConnConfig.DefaultQueryExecMode to pgx.QueryExecModeExec (docs/poolers.md)",
				ErrPreparedStatementsThroughPooler, mode)
		}
	}
	if c.cfg.DisableListen {
		return nil, nil
	}
	if c.cfg.SessionURL != "" {
		cfg, err := pgx.ParseConfig(c.cfg.SessionURL)
		if err != nil {
			return nil, fmt.Errorf("pgoutbox: Config.SessionURL: %w", err)
		}
		cfg.RuntimeParams["application_name"] = "pgoutbox-listener"
		through, err := sessionPooled(ctx, cfg)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			c.log.Warn("could not check Config.SessionURL; the listener will keep trying to connect", "err", err)
		case through:
			return nil, errors.New("pgoutbox: Config.SessionURL goes through a transaction-pooling proxy too; " +
				"LISTEN needs a session: give PostgreSQL's own address (or a pooler in session mode) (docs/poolers.md)")
		}
		return cfg, nil
	}
	if pooled {
		c.log.Warn("the pool goes through a transaction-pooling proxy, where LISTEN cannot work: "+
			"claim loops poll instead of waking on NOTIFY; set Config.SessionURL (PGOUTBOX_SESSION_DATABASE_URL) "+
			"to a direct connection string to wake them (docs/poolers.md)", "poll_interval", c.cfg.PollInterval)
		return nil, nil
	}
	cfg := c.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "pgoutbox-listener"
	return cfg, nil
}
