package pgoutbox

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// listen holds one dedicated connection (cfg: Config.SessionURL, or the
// pool's configuration) in LISTEN and wakes the queue named
// by each notification. After every (re)connect it wakes every queue: the
// catch-up read for notifications missed while disconnected. The poll
// interval covers the time the connection is down.
func (c *Client) listen(ctx context.Context, cfg *pgx.ConnConfig) {
	defer c.runWG.Done()
	backoff := 100 * time.Millisecond
	down := false // logged once per outage: the first failure, then the reconnect
	for ctx.Err() == nil {
		connected, err := c.listenOnce(ctx, cfg, &down)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = 100 * time.Millisecond
		}
		if !down {
			down = true
			c.log.Warn("listener disconnected; polling until it reconnects (logged once until it does)", "err", err, "retry_in", backoff)
		} else {
			c.log.Debug("listener reconnect failed", "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, listenRetryMax)
	}
}

// listenOnce connects, LISTENs, wakes every queue and relays notifications
// until the connection fails. *down is the outage state of listen: a
// successful LISTEN after a failure logs the reconnect and clears it.
func (c *Client) listenOnce(ctx context.Context, cfg *pgx.ConnConfig, down *bool) (connected bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, store.ListenSQL); err != nil {
		return false, err
	}
	if *down {
		*down = false
		c.log.Warn("listener reconnected")
	}
	for _, q := range c.queues {
		signal(q.wake)
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		if q, ok := c.queues[n.Payload]; ok {
			signal(q.wake)
		}
	}
}
