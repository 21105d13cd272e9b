package pgoutbox

import (
	"context"
	"fmt"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Backlog is what a queue still has to deliver (QueueBacklog).
type Backlog struct {
	// Available counts available effects: new ones, retries waiting for
	// their backoff and effects scheduled for later.
	Available int64
	// Ready counts the Available effects that are due (claimable now).
	Ready int64
	// Leased counts effects under a lease (in delivery, or handed to a
	// broker).
	Leased int64
}

// QueueBacklog counts queue's available (and, of those, due) and leased
// effects, through the claim and lease-expiry indexes: it never reads the
// retained history.
func QueueBacklog(ctx context.Context, db DB, queue string) (Backlog, error) {
	b, err := store.QueueBacklog(ctx, db, queue)
	if err != nil {
		return Backlog{}, fmt.Errorf("pgoutbox: backlog of %q: %w", queue, err)
	}
	return Backlog{Available: b.Available, Ready: b.Ready, Leased: b.Leased}, nil
}

// KeysPastAvailable returns those of keys that name an effect of queue that
// has left the available state: delivered, being delivered, or waiting for
// an operator (dead_letter, reconciliation_required). Keys naming no effect,
// or one still waiting to be claimed, are left out; the order is
// unspecified. Run it in the enqueuing transaction to decide whether an
// idempotency key would be a duplicate of work already done (Enqueue
// returns the existing effect's id for a key it already holds).
func KeysPastAvailable(ctx context.Context, db DB, queue string, keys []string) ([]string, error) {
	out, err := store.KeysPastAvailable(ctx, db, queue, keys)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: look up keys of %q: %w", queue, err)
	}
	return out, nil
}
