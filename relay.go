package pgoutbox

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Broker relaying (docs/design.md, "Scale-out"). When delivery moves onto a
// broker, PostgreSQL stays the source of truth and every transition stays
// fenced:
//
//	available --ClaimRelay--> leased (relay) --HandOver--> leased (HandoffOwner)
//	leased (HandoffOwner | the relay's token | expired) | available
//	    --TakeOver--> leased (consumer, attempts+1) --Run--> completed
//	                                                   | HandBack (retry via the broker)
//	                                                   | Fail (dead_letter, reconciliation_required)
//
// A relay's claim does not count a delivery attempt: attempts counts
// deliveries to the target, which only consumers make. A hand-over keeps the
// effect leased under a long lease (the retry horizon): should the broker
// lose the message, the sweeper recovers the effect when that lease expires
// and the relay publishes it again.

// HandoffOwner is the lease_owner of an effect that a relay handed over to a
// broker (or a consumer handed back for a retry): it is waiting in the broker
// for a consumer to take it over.
const HandoffOwner = "pgoutbox:handoff"

// NotifyChannel is the LISTEN/NOTIFY channel on which the engine announces
// newly available effects; the payload is the queue name.
const NotifyChannel = store.NotifyChannel

func leasesOf(claimed []store.Claimed) []*Lease {
	out := make([]*Lease, len(claimed))
	for i, cl := range claimed {
		out[i] = newLease(cl)
	}
	return out
}

func newLease(cl store.Claimed) *Lease {
	return &Lease{Delivery: *newDelivery(cl), fence: store.Fence{ID: cl.ID, Token: cl.Token, Type: cl.Type}}
}

func fencesOf(leases []*Lease) []store.Fence {
	out := make([]store.Fence, len(leases))
	for i, l := range leases {
		out[i] = l.fence
	}
	return out
}

// ClaimRelay leases up to limit available effects of queue for a relay
// (owner), oldest (available_at, id) first, with FOR UPDATE SKIP LOCKED. Unlike
// ClaimLeases it does not count a delivery attempt: Attempt is the number of
// deliveries made so far (0 for a new effect).
func ClaimRelay(ctx context.Context, db DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	claimed, err := store.ClaimRelay(ctx, db, queue, owner, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: relay claim: %w", err)
	}
	return leasesOf(claimed), nil
}

// HandOver records, in one fenced statement, that the broker accepted the
// relay's leases: each effect stays leased, owned by HandoffOwner under a
// fresh token, until now()+lease (database clock). It returns the ids handed
// over; an id missing from the result was taken over by a consumer before the
// hand-over committed (or its lease was recovered), and nothing was written
// for it. The leases must not be used afterwards.
func HandOver(ctx context.Context, db DB, leases []*Lease, lease time.Duration) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	done, err := store.HandOver(ctx, db, fencesOf(leases), HandoffOwner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: hand over: %w", err)
	}
	return done, nil
}

// Release returns a relay's lease to available after delay (database clock)
// without judging a delivery attempt, recording reason as last_error: the
// relay could not publish the effect. It returns ErrLeaseLost when the lease
// was lost.
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

// HandBack records that this attempt failed with nothing delivered and that
// the broker will deliver the effect again: the effect stays leased, owned by
// HandoffOwner under a fresh token, until now()+lease, and
// delivery_started_at is cleared. herr is recorded as last_error. Use it only
// for an outcome that Run reported as Retry. It returns ErrLeaseLost when the
// lease was lost.
func (l *Lease) HandBack(ctx context.Context, db DB, lease time.Duration, herr error) error {
	msg := ""
	if herr != nil {
		msg = herr.Error()
	}
	ok, err := store.HandBack(ctx, db, l.fence, HandoffOwner, lease, msg)
	if err != nil {
		return fmt.Errorf("pgoutbox: hand back: %w", err)
	}
	if !ok {
		return leaseLost("hand back", l.ID)
	}
	return nil
}

// Handoff names the effect a broker message carries: its id, type and
// idempotency key (all three must match the row), and the lease token of the
// relay that published it.
type Handoff struct {
	// ID, Type and Key must all match the effect's row.
	ID   int64
	Type string
	Key  string
	// RelayToken is the lease token (Delivery.LeaseToken) of the relay's
	// claim under which the message was published.
	RelayToken string
}

// TakeOverAction says what TakeOver did with one Handoff.
type TakeOverAction string

// Take-over actions.
const (
	// TakenOver: the effect is leased to the consumer (attempts+1); deliver
	// it with Lease.Run.
	TakenOver TakeOverAction = "taken"
	// TakeOverSettled: the effect is already completed, dead_letter or
	// reconciliation_required (State says which); acknowledge the message.
	TakeOverSettled TakeOverAction = "settled"
	// TakeOverBusy: another worker holds a live lease on the effect, its row
	// is locked, or it is not yet due; ask the broker to redeliver after
	// Wait.
	TakeOverBusy TakeOverAction = "busy"
	// TakeOverReconciled: a previous delivery of this non-replay-safe effect
	// started and its outcome was never recorded; it is now
	// reconciliation_required and must not be redelivered.
	TakeOverReconciled TakeOverAction = "reconciled"
	// TakeOverExhausted: attempts were exhausted; it is now dead_letter.
	TakeOverExhausted TakeOverAction = "exhausted"
	// TakeOverMissing: no effect has this id, type and key (pruned, or the
	// message belongs to another database).
	TakeOverMissing TakeOverAction = "missing"
)

// TakeOverResult is the outcome of one Handoff.
type TakeOverResult struct {
	// Action is what was done.
	Action TakeOverAction
	// Lease is set when Action is TakenOver.
	Lease *Lease
	// State is the effect's state after the take-over.
	State State
	// Wait is, for TakeOverBusy, how long until the effect may be taken
	// (the holder's lease expires or the effect becomes due); zero when
	// unknown (a locked row).
	Wait time.Duration
}

// TakeOver gives owner a lease of duration lease on each effect a broker
// consumer may deliver now, in one statement, and routes those it may not:
// see TakeOverAction. An effect may be taken when it is handed over
// (HandoffOwner), still leased by the relay that published the message
// (Handoff.RelayToken: the message can arrive before the hand-over commits),
// leased under an expired lease, or available and due. Before a take, the
// sweeper's rules apply, so a crash between delivery and its record is never
// replayed blindly. Results are in input order; a Handoff repeating an earlier
// id in the same call is reported busy.
func TakeOver(ctx context.Context, db DB, handoffs []Handoff, owner string, lease time.Duration) ([]TakeOverResult, error) {
	out := make([]TakeOverResult, len(handoffs))
	reqs := make([]store.TakeOverReq, 0, len(handoffs))
	at := make([]int, 0, len(handoffs))
	seen := make(map[int64]bool, len(handoffs))
	for i, h := range handoffs {
		if seen[h.ID] {
			out[i] = TakeOverResult{Action: TakeOverBusy, Wait: time.Second}
			continue
		}
		seen[h.ID] = true
		tok, err := uuid.Parse(h.RelayToken)
		if err != nil {
			tok = uuid.Nil
		}
		reqs = append(reqs, store.TakeOverReq{ID: h.ID, Type: h.Type, Key: h.Key, RelayToken: tok})
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return out, nil
	}
	res, err := store.TakeOver(ctx, db, reqs, HandoffOwner, owner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: take over: %w", err)
	}
	for j, r := range res {
		tr := TakeOverResult{State: State(r.State), Wait: r.Wait}
		switch r.Action {
		case store.TakeTaken:
			tr.Action, tr.Lease = TakenOver, newLease(r.Claimed)
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

// RetryHorizon is the longest time an effect handed to a broker may keep
// being delivered: maxAttempts attempts, each taking at most perAttempt (a
// consumer's lease: a crashed consumer's effect is taken over when its lease
// expires) and followed by the largest backoff (2^attempt s capped at
// backoffCap, +10 % jitter), plus one more perAttempt for the last
// redelivery. A broker's duplicate window must be at least this long, so
// that the relay publishing an effect again within it (after a relay crash,
// or when a hand-over lease expires) never stores a second message.
func RetryHorizon(maxAttempts int, backoffCap, perAttempt time.Duration) time.Duration {
	if maxAttempts <= 0 {
		maxAttempts = MaxAttemptsDefault
	}
	if backoffCap <= 0 {
		backoffCap = BackoffCapDefault
	}
	total := perAttempt
	for a := 1; a <= maxAttempts; a++ {
		b := math.Pow(2, float64(a)) * float64(time.Second)
		if b > float64(backoffCap) {
			b = float64(backoffCap)
		}
		total += perAttempt + time.Duration(b*1.1)
	}
	return total
}
