package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// RequeueOptions selects the stalled leases to requeue.
type RequeueOptions struct {
	// Filter narrows the requeue (default: every queue and type).
	Filter Filter
	// StalledAfter is the lease age from which a lease is stalled; ≤ 0 means
	// StalledAfterDefault.
	StalledAfter time.Duration
	// Limit caps the run; ≤ 0 means RequeueLimitDefault.
	Limit int
	// DryRun reports what would move and changes nothing.
	DryRun bool
}

// RequeueResult is what a requeue did (or would do).
type RequeueResult struct {
	DryRun              bool    `json:"dry_run"`
	StalledAfterSeconds float64 `json:"stalled_after_seconds"`
	Requeued            []Moved `json:"requeued"`
}

// RequeueStale recovers leases held longer than StalledAfter with the
// sweeper's routing: available, dead_letter when attempts are exhausted, or
// reconciliation_required for a non-replay-safe effect whose delivery
// started (never back to available).
func RequeueStale(ctx context.Context, pool *pgxpool.Pool, o RequeueOptions) (*RequeueResult, error) {
	if o.StalledAfter <= 0 {
		o.StalledAfter = StalledAfterDefault
	}
	if o.Limit <= 0 {
		o.Limit = RequeueLimitDefault
	}
	res := &RequeueResult{DryRun: o.DryRun, StalledAfterSeconds: o.StalledAfter.Seconds(), Requeued: []Moved{}}
	err := inTx(ctx, pool, o.DryRun, func(tx pgx.Tx) error {
		moved, err := store.RequeueStale(ctx, tx, o.StalledAfter, o.Filter.store(), o.Limit)
		if err != nil {
			return err
		}
		res.Requeued = toMoved(moved)
		return notify(ctx, tx, moved)
	})
	if err != nil {
		return nil, fmt.Errorf("ops: requeue stale leases: %w", err)
	}
	return res, nil
}

// inTx runs fn in a transaction that commits, or rolls back on a dry run.
func inTx(ctx context.Context, pool *pgxpool.Pool, dryRun bool, fn func(pgx.Tx) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if dryRun {
		return nil
	}
	return tx.Commit(ctx)
}

// notify wakes the workers of the queues that got available effects.
func notify(ctx context.Context, tx pgx.Tx, moved []store.Moved) error {
	var queues []string
	for _, m := range moved {
		if m.State == "available" {
			queues = append(queues, m.Queue)
		}
	}
	if len(queues) == 0 {
		return nil
	}
	return store.NotifyQueues(ctx, tx, queues)
}

func toMoved(ms []store.Moved) []Moved {
	out := make([]Moved, len(ms))
	for i, m := range ms {
		out[i] = Moved{ID: m.ID, Queue: m.Queue, Type: m.Type, State: m.State,
			LeaseOwner: m.Owner, LeaseHeldSeconds: m.HeldFor}
	}
	return out
}
