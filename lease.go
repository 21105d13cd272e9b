package pgoutbox

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// State is an effect's state (docs/design.md, "States"; the engine's type,
// as the root names it).
type State = engine.State

// Effect states.
const (
	// StateAvailable: waiting to be claimed, now or at its available_at
	// (a new effect, or one retrying after a backoff).
	StateAvailable State = engine.StateAvailable
	// StateLeased: claimed by a worker (or handed to a broker) under a
	// lease that a sweeper recovers once it expires.
	StateLeased State = engine.StateLeased
	// StateCompleted: delivered; pruned after Config.CompletedRetention.
	StateCompleted State = engine.StateCompleted
	// StateDeadLetter: failed permanently or ran out of attempts; kept until
	// an operator replays it (pgoutbox dlq).
	StateDeadLetter State = engine.StateDeadLetter
	// StateReconciliationRequired: a delivery of a type that is not
	// replay-safe started and its outcome is unknown; kept until an
	// operator calls Resolve.
	StateReconciliationRequired State = engine.StateReconciliationRequired
)

// Lease is an effect claimed through the manual API (ClaimLeases, or
// ClaimRelayLeases and TakeOver for a broker), for callers that deliver
// outside a Client (the projection's projector, adapters/nats): deliver it
// with Deliver, or record its outcome with Complete or Fail. Every
// method is fenced by the effect id, the lease token and the effect type; a
// lease that was recovered returns ErrLeaseLost and changes nothing.
type Lease struct {
	Delivery
	fence       store.Fence
	traceparent string // the enqueue's W3C traceparent, "" for none
}

// ClaimLeases leases up to limit available effects of queue for owner, oldest
// (available_at, id) first, with FOR UPDATE SKIP LOCKED.
func ClaimLeases(ctx context.Context, db DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	claimed, err := store.Claim(ctx, db, queue, owner, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: claim: %w", err)
	}
	return leasesOf(claimed), nil
}

func leasesOf(claimed []store.Claimed) []*Lease {
	out := make([]*Lease, len(claimed))
	for i, cl := range claimed {
		out[i] = newLease(cl)
	}
	return out
}

func newLease(cl store.Claimed) *Lease {
	return &Lease{Delivery: *newDelivery(cl), fence: cl.Fence(), traceparent: cl.Traceparent}
}

// Traceparent is the W3C traceparent the effect's enqueue stored (its
// creation context, docs/operations.md "Tracing"), "" when it has none: a
// relay passes it on to its broker as a traceparent message header.
// (*Lease).Deliver continues it itself.
func (l *Lease) Traceparent() string { return l.traceparent }

func leaseLost(op string, id int64) error {
	return fmt.Errorf("pgoutbox: %s effect %d: %w", op, id, ErrLeaseLost)
}

// Complete marks the effect completed (inside tx when db is a transaction).
func (l *Lease) Complete(ctx context.Context, db DB) error {
	done, err := store.Complete(ctx, db, []store.Fence{l.fence})
	if err != nil {
		return fmt.Errorf("pgoutbox: complete: %w", err)
	}
	if _, ok := done[l.fence]; !ok {
		return leaseLost("complete", l.ID)
	}
	return nil
}

// MarkStarted commits that delivery of a non-replay-safe effect starts now;
// from then on an unknown outcome routes it to reconciliation_required.
func (l *Lease) MarkStarted(ctx context.Context, db DB) error {
	ok, err := store.MarkStarted(ctx, db, l.fence)
	if err != nil {
		return fmt.Errorf("pgoutbox: mark started: %w", err)
	}
	if !ok {
		return leaseLost("mark started", l.ID)
	}
	return nil
}

// Fail records a failed delivery classified like a handler's error (see
// Retry, RetryAfter, Permanent, Ambiguous) for an effect type of the given
// replay safety, with backoff capped at backoffCap, and returns the new state.
func (l *Lease) Fail(ctx context.Context, db DB, herr error, replaySafe bool, backoffCap time.Duration) (State, error) {
	r := engine.RouteOf(herr, replaySafe, l.Attempt, backoffCap)
	state, found, err := store.Fail(ctx, db, l.fence, r.Kind, r.Delay, herr.Error())
	if err != nil {
		return "", fmt.Errorf("pgoutbox: fail: %w", err)
	}
	if !found {
		return "", leaseLost("fail", l.ID)
	}
	return State(state), nil
}

// Extend pushes the lease to now()+d (database clock).
func (l *Lease) Extend(ctx context.Context, db DB, d time.Duration) error {
	kept, err := store.Extend(ctx, db, []store.Fence{l.fence}, d)
	if err != nil {
		return fmt.Errorf("pgoutbox: extend: %w", err)
	}
	if !kept[l.fence] {
		return leaseLost("extend", l.ID)
	}
	return nil
}
