package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// ListenRetryInitial is the listener's first wait before reconnecting; each
// further failure doubles it, up to Listener.RetryMax.
const ListenRetryInitial = 100 * time.Millisecond

// Listener holds one dedicated connection in LISTEN on store.NotifyChannel
// and wakes the queue named by each notification. After every (re)connect
// it wakes every queue: the catch-up read for notifications missed while
// disconnected (the poll interval covers the time the connection is down).
type Listener struct {
	// Config is the connection's configuration (a session, not a
	// transaction-pooling proxy).
	Config *pgx.ConnConfig
	// RetryMax caps the wait between reconnection attempts.
	RetryMax time.Duration
	// Wake wakes the claim loop of queue; WakeAll wakes every loop.
	Wake    func(queue string)
	WakeAll func()
	// Log receives the outage, logged once until the reconnect.
	Log *slog.Logger
}

// Run listens until ctx ends.
func (l *Listener) Run(ctx context.Context) {
	backoff := ListenRetryInitial
	down := false // logged once per outage: the first failure, then the reconnect
	for ctx.Err() == nil {
		connected, err := l.once(ctx, &down)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = ListenRetryInitial
		}
		if !down {
			down = true
			l.Log.Warn("listener disconnected; polling until it reconnects (logged once until it does)", "err", err, "retry_in", backoff)
		} else {
			l.Log.Debug("listener reconnect failed", "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, l.RetryMax)
	}
}

// once connects, LISTENs, wakes every queue and relays notifications until
// the connection fails. *down is the outage state of Run: a successful
// LISTEN after a failure logs the reconnect and clears it.
func (l *Listener) once(ctx context.Context, down *bool) (connected bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, l.Config)
	if err != nil {
		return false, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	// The end of ctx does not cut the LISTEN short (Outlive).
	lctx, cancel := Outlive(ctx)
	_, err = conn.Exec(lctx, store.ListenSQL)
	cancel()
	if err != nil {
		return false, err
	}
	if *down {
		*down = false
		l.Log.Warn("listener reconnected")
	}
	l.WakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		l.Wake(n.Payload)
	}
}

// Signal sends on ch without blocking: a wake-up already pending is enough.
func Signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
