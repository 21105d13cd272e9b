package pgoutbox

// The fenced transitions by which a broker relay and its consumers share
// the effects of PostgreSQL (docs/scale-out.md): a relay claims effects
// without counting an attempt and hands them over to a broker; a consumer
// takes over the effect a message names, delivers it (Lease.Deliver) and
// hands a retry back to the broker. PostgreSQL stays the source of truth and
// every transition is fenced by the lease: adapters/nats is built on these.

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// ClaimRelayLeases leases up to limit available effects of queue for a
// broker relay (owner), oldest (available_at, id) first, with FOR UPDATE
// SKIP LOCKED, until now()+lease (database clock). Unlike ClaimLeases it
// counts no delivery attempt: a relay publishes, it does not deliver, and
// Delivery.Attempt is the number of deliveries made so far (0 for a new
// effect).
func ClaimRelayLeases(ctx context.Context, db DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	claimed, err := store.ClaimRelay(ctx, db, queue, owner, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: relay claim: %w", err)
	}
	return leasesOf(claimed), nil
}

// HandOver records, in one fenced statement, that a broker accepted the
// relay's leases: each effect stays leased, now owned by owner (the
// hand-off marker consumers take over from) under a fresh token, until
// now()+lease (database clock): the retry horizon, after which the sweeper
// recovers an effect the broker lost. It returns the ids handed over; an id
// missing from the result was taken over by a consumer before the
// hand-over committed (or its lease was recovered), and nothing was written
// for it. The leases must not be used afterwards.
func HandOver(ctx context.Context, db DB, leases []*Lease, owner string, lease time.Duration) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	fences := make([]store.Fence, len(leases))
	for i, l := range leases {
		fences[i] = l.fence
	}
	done, err := store.HandOver(ctx, db, fences, owner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: hand over: %w", err)
	}
	return done, nil
}

// Release returns the lease's effect to available after delay (database
// clock) without judging a delivery attempt, recording reason as
// last_error: a relay could not publish it. It returns ErrLeaseLost
// (wrapped) when the lease was lost.
func (l *Lease) Release(ctx context.Context, db DB, delay time.Duration, reason string) error {
	ok, err := store.Release(ctx, db, l.fence, delay, reason)
	if err != nil {
		return fmt.Errorf("pgoutbox: release: %w", err)
	}
	if !ok {
		return leaseLost("release", l.ID)
	}
	return nil
}

// DeadLetter moves the effect to dead_letter now, recording reason's text
// as last_error, whatever attempts remain: it can never be delivered (a
// relay's broker refuses its subject or payload). It returns ErrLeaseLost
// (wrapped) when the lease was lost.
func (l *Lease) DeadLetter(ctx context.Context, db DB, reason error) error {
	_, found, err := store.Fail(ctx, db, l.fence, store.FailDeadLetter, 0, reason.Error())
	if err != nil {
		return fmt.Errorf("pgoutbox: dead letter: %w", err)
	}
	if !found {
		return leaseLost("dead letter", l.ID)
	}
	return nil
}

// HandBack records that a consumer's attempt failed with nothing delivered
// and that the broker will deliver the effect again: it stays leased, owned
// by owner (the hand-off marker) under a fresh token, until now()+lease,
// and its delivery start is cleared. herr's text (empty when nil) is
// recorded as last_error. Use it only for an outcome classified as a retry
// (DeliverOptions.HandBack). It returns ErrLeaseLost (wrapped) when the
// lease was lost.
func (l *Lease) HandBack(ctx context.Context, db DB, owner string, lease time.Duration, herr error) error {
	msg := ""
	if herr != nil {
		msg = herr.Error()
	}
	ok, err := store.HandBack(ctx, db, l.fence, owner, lease, msg)
	if err != nil {
		return fmt.Errorf("pgoutbox: hand back: %w", err)
	}
	if !ok {
		return leaseLost("hand back", l.ID)
	}
	return nil
}

// BrokerMessage names the effect a broker message carries: its id, type
// and idempotency key (all three must match the row), and the lease token
// of the relay claim it was published under.
type BrokerMessage struct {
	// ID, Type and Key must all match the effect's row.
	ID   int64
	Type string
	Key  string
	// RelayToken is the Delivery.LeaseToken of the relay's claim; one that
	// does not parse as a UUID matches no lease.
	RelayToken string
}

// TakeOverAction says what TakeOver did with one BrokerMessage.
type TakeOverAction string

// Take-over actions.
const (
	// TakeOverTaken: the effect is leased to the consumer (attempts+1);
	// deliver it.
	TakeOverTaken TakeOverAction = "taken"
	// TakeOverSettled: the effect is already completed, dead_letter or
	// reconciliation_required (TakeOverResult.State says which).
	TakeOverSettled TakeOverAction = "settled"
	// TakeOverBusy: another worker holds a live lease on the effect, its
	// row is locked, or it is not yet due; try again after
	// TakeOverResult.Wait.
	TakeOverBusy TakeOverAction = "busy"
	// TakeOverReconciled: a previous delivery of this non-replay-safe
	// effect started and its outcome was never recorded; it is now
	// reconciliation_required and must not be delivered again.
	TakeOverReconciled TakeOverAction = "reconciled"
	// TakeOverExhausted: attempts were exhausted; it is now dead_letter.
	TakeOverExhausted TakeOverAction = "exhausted"
	// TakeOverMissing: no effect has this id, type and key (pruned, or the
	// message belongs to another database).
	TakeOverMissing TakeOverAction = "missing"
)

// TakeOverResult is the outcome of one BrokerMessage.
type TakeOverResult struct {
	// Action is what was done.
	Action TakeOverAction
	// Lease is set when Action is TakeOverTaken.
	Lease *Lease
	// State is the effect's state after the take-over.
	State State
	// Wait is, for TakeOverBusy, how long until the effect may be taken
	// (the holder's lease expires or the effect becomes due); zero when
	// unknown (a locked row).
	Wait time.Duration
}

// TakeOver gives owner a lease of duration lease on each effect a broker
// consumer may deliver now, in one statement, and routes those it may not
// (TakeOverAction). An effect may be taken when it is handed over
// (lease_owner handoff, the marker given to HandOver and HandBack), still
// leased by the relay claim that published the message (its RelayToken:
// the message can arrive before the hand-over commits), leased under an
// expired lease, or available and due. Before a take the sweeper's rules
// apply, so a crash between a delivery and its record is never replayed
// blindly. Results are in input order; a message repeating an earlier id in
// the same call is reported busy with a Wait of one second.
func TakeOver(ctx context.Context, db DB, msgs []BrokerMessage, handoff, owner string, lease time.Duration) ([]TakeOverResult, error) {
	out := make([]TakeOverResult, len(msgs))
	reqs := make([]store.TakeOverReq, 0, len(msgs))
	at := make([]int, 0, len(msgs))
	seen := make(map[int64]bool, len(msgs))
	for i, m := range msgs {
		if seen[m.ID] {
			out[i] = TakeOverResult{Action: TakeOverBusy, Wait: time.Second}
			continue
		}
		seen[m.ID] = true
		tok, err := uuid.Parse(m.RelayToken)
		if err != nil {
			tok = uuid.Nil
		}
		reqs = append(reqs, store.TakeOverReq{ID: m.ID, Type: m.Type, Key: m.Key, RelayToken: tok})
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return out, nil
	}
	res, err := store.TakeOver(ctx, db, reqs, handoff, owner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: take over: %w", err)
	}
	for j, r := range res {
		tr := TakeOverResult{State: State(r.State), Wait: r.Wait}
		switch r.Action {
		case store.TakeTaken:
			tr.Action, tr.Lease = TakeOverTaken, newLease(r.Claimed)
		case store.TakeSettled:
			tr.Action = TakeOverSettled
		case store.TakeReconcile:
			tr.Action = TakeOverReconciled
		case store.TakeExhausted:
			tr.Action = TakeOverExhausted
		case store.TakeMissing:
			tr.Action = TakeOverMissing
		default:
			tr.Action = TakeOverBusy
		}
		out[at[j]] = tr
	}
	return out, nil
}
