package pgoutbox

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
)

// ListenRetryMaxDefault is EnqueueListener.RetryMax's default.
const ListenRetryMaxDefault = 5 * time.Second

// EnqueueListener wakes a claim loop when effects are enqueued, as a
// Client's listener does: it holds one dedicated connection in LISTEN on
// the channel the enqueue path notifies (with the effect's queue as
// payload) and calls Wake for each notification. After every (re)connect it
// calls WakeAll: notifications sent while it was disconnected are lost, so
// the loops read once; a poll must cover the time the connection is down.
type EnqueueListener struct {
	// Config is the connection's configuration: a session, not a
	// transaction-pooling proxy (LISTEN needs one). Required.
	Config *pgx.ConnConfig
	// RetryMax caps the wait between reconnection attempts (doubling from
	// 100 ms); 0 means ListenRetryMaxDefault.
	RetryMax time.Duration
	// Wake wakes the loop of queue; WakeAll wakes every loop. Both must
	// return at once (send on a buffered channel without blocking).
	Wake    func(queue string)
	WakeAll func()
	// Log receives an outage, once until the reconnect; nil discards.
	Log *slog.Logger
}

// Run listens until ctx ends.
func (l *EnqueueListener) Run(ctx context.Context) {
	cl := engine.Listener{Config: l.Config, RetryMax: l.RetryMax, Wake: l.Wake, WakeAll: l.WakeAll, Log: l.Log}
	if cl.RetryMax <= 0 {
		cl.RetryMax = ListenRetryMaxDefault
	}
	if cl.Log == nil {
		cl.Log = slog.New(slog.DiscardHandler)
	}
	cl.Run(ctx)
}
