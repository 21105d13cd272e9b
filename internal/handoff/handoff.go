// Package handoff is the protocol by which a broker relay and its consumers
// (adapters/nats) share the effects of PostgreSQL (docs/scale-out.md).
// PostgreSQL stays the source of truth and every transition
// stays fenced:
//
//	available --ClaimRelay--> leased (relay) --HandOver--> leased (Owner)
//	leased (Owner | the relay's token | expired) | available
//	    --TakeOver--> leased (consumer, attempts+1) --deliver--> completed
//	                                                  | HandBack (retry via the broker)
//	                                                  | fail (dead_letter, reconciliation_required)
//
// A relay's claim does not count a delivery attempt: attempts counts
// deliveries to the target, which only consumers make. A hand-over keeps the
// effect leased under a long lease (the retry horizon): should the broker
// lose the message, the sweeper recovers the effect when that lease expires
// and the relay publishes it again.
//
// It imports the root package (for Delivery, ErrLeaseLost and the engine's
// defaults) and internal/store, whose statements it runs; the root package
// must never import it. Nothing here is part of the library's API: an
// application uses adapters/nats.
package handoff

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Owner is the lease_owner of an effect that a relay handed over to a broker
// (or a consumer handed back for a retry): it is waiting in the broker for a
// consumer to take it over.
const Owner = "pgoutbox:handoff"

// Lease is an effect leased by a relay (ClaimRelay) or a consumer
// (TakeOver). Every write through it is fenced by Fence: a lease that was
// recovered or handed over returns pgoutbox.ErrLeaseLost and changes
// nothing.
type Lease struct {
	pgoutbox.Delivery
	// Fence is the lease: effect id, lease token and effect type.
	Fence store.Fence
}

func newLease(cl store.Claimed) *Lease {
	l := &Lease{
		Delivery: pgoutbox.Delivery{
			ID: cl.ID, Queue: cl.Queue, Type: cl.Type, Key: cl.Key, Payload: cl.Payload,
			Attempt: cl.Attempt, MaxAttempts: cl.MaxAttempts, CreatedAt: cl.CreatedAt, OrderingKey: cl.OrderingKey,
		},
		Fence: cl.Fence(),
	}
	if cl.Token != (uuid.UUID{}) {
		l.LeaseToken = cl.Token.String()
	}
	return l
}

func leaseLost(op string, id int64) error {
	return fmt.Errorf("handoff: %s effect %d: %w", op, id, pgoutbox.ErrLeaseLost)
}

// ClaimRelay leases up to limit available effects of queue for a relay
// (owner), oldest (available_at, id) first, with FOR UPDATE SKIP LOCKED,
// until now()+lease (database clock). Unlike a worker's claim it does not
// count a delivery attempt: Attempt is the number of deliveries made so far
// (0 for a new effect).
func ClaimRelay(ctx context.Context, db pgoutbox.DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	claimed, err := store.ClaimRelay(ctx, db, queue, owner, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("handoff: relay claim: %w", err)
	}
	out := make([]*Lease, len(claimed))
	for i, cl := range claimed {
		out[i] = newLease(cl)
	}
	return out, nil
}

// HandOver records, in one fenced statement, that the broker accepted the
// relay's leases: each effect stays leased, owned by Owner under a fresh
// token, until now()+lease (database clock). It returns the ids handed over;
// an id missing from the result was taken over by a consumer before the
// hand-over committed (or its lease was recovered), and nothing was written
// for it. The leases must not be used afterwards.
func HandOver(ctx context.Context, db pgoutbox.DB, leases []*Lease, lease time.Duration) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	fences := make([]store.Fence, len(leases))
	for i, l := range leases {
		fences[i] = l.Fence
	}
	done, err := store.HandOver(ctx, db, fences, Owner, lease)
	if err != nil {
		return nil, fmt.Errorf("handoff: hand over: %w", err)
	}
	return done, nil
}

// Release returns a relay's lease to available after delay (database clock)
// without judging a delivery attempt, recording reason as last_error: the
// relay could not publish the effect. It returns pgoutbox.ErrLeaseLost
// (wrapped) when the lease was lost.
func (l *Lease) Release(ctx context.Context, db pgoutbox.DB, delay time.Duration, reason string) error {
	ok, err := store.Release(ctx, db, l.Fence, delay, reason)
	if err != nil {
		return fmt.Errorf("handoff: release: %w", err)
	}
	if !ok {
		return leaseLost("release", l.ID)
	}
	return nil
}

// DeadLetter moves the effect to dead_letter now, recording reason's text as
// last_error: the relay can never publish it (a subject or payload the
// broker refuses). It returns pgoutbox.ErrLeaseLost (wrapped) when the lease
// was lost.
func (l *Lease) DeadLetter(ctx context.Context, db pgoutbox.DB, reason error) error {
	_, found, err := store.Fail(ctx, db, l.Fence, store.FailDeadLetter, 0, reason.Error())
	if err != nil {
		return fmt.Errorf("handoff: dead letter: %w", err)
	}
	if !found {
		return leaseLost("dead letter", l.ID)
	}
	return nil
}

// HandBack records that a consumer's attempt failed with nothing delivered
// and that the broker will deliver the effect again: the effect stays
// leased, owned by Owner under a fresh token, until now()+lease, and
// delivery_started_at is cleared. herr's text (empty when nil) is recorded
// as last_error. Use it only for an outcome classified as a retry. It
// returns pgoutbox.ErrLeaseLost (wrapped) when the lease was lost.
func (l *Lease) HandBack(ctx context.Context, db pgoutbox.DB, lease time.Duration, herr error) error {
	msg := ""
	if herr != nil {
		msg = herr.Error()
	}
	ok, err := store.HandBack(ctx, db, l.Fence, Owner, lease, msg)
	if err != nil {
		return fmt.Errorf("handoff: hand back: %w", err)
	}
	if !ok {
		return leaseLost("hand back", l.ID)
	}
	return nil
}

// Message names the effect a broker message carries: its id, type and
// idempotency key (all three must match the row), and the lease token of the
// relay that published it.
type Message struct {
	// ID, Type and Key must all match the effect's row.
	ID   int64
	Type string
	Key  string
	// RelayToken is the lease token (Delivery.LeaseToken) of the relay's
	// claim under which the message was published; one that does not parse
	// as a UUID matches no lease.
	RelayToken string
}

// Action says what TakeOver did with one Message; its value is the metric
// label adapters/nats records.
type Action string

// Take-over actions.
const (
	// Taken: the effect is leased to the consumer (attempts+1); deliver it.
	Taken Action = "taken"
	// Settled: the effect is already completed, dead_letter or
	// reconciliation_required (Result.State says which); acknowledge the
	// message.
	Settled Action = "settled"
	// Busy: another worker holds a live lease on the effect, its row is
	// locked, or it is not yet due; ask the broker to redeliver after
	// Result.Wait.
	Busy Action = "busy"
	// Reconciled: a previous delivery of this non-replay-safe effect
	// started and its outcome was never recorded; it is now
	// reconciliation_required and must not be redelivered.
	Reconciled Action = "reconciled"
	// Exhausted: attempts were exhausted; it is now dead_letter.
	Exhausted Action = "exhausted"
	// Missing: no effect has this id, type and key (pruned, or the message
	// belongs to another database).
	Missing Action = "missing"
)

// Result is the outcome of one Message.
type Result struct {
	// Action is what was done.
	Action Action
	// Lease is set when Action is Taken.
	Lease *Lease
	// State is the effect's state after the take-over.
	State pgoutbox.State
	// Wait is, for Busy, how long until the effect may be taken (the
	// holder's lease expires or the effect becomes due); zero when unknown
	// (a locked row).
	Wait time.Duration
}

// TakeOver gives owner a lease of duration lease on each effect a broker
// consumer may deliver now, in one statement, and routes those it may not:
// see Action. An effect may be taken when it is handed over (Owner), still
// leased by the relay that published the message (Message.RelayToken: the
// message can arrive before the hand-over commits), leased under an expired
// lease, or available and due. Before a take, the sweeper's rules apply, so
// a crash between delivery and its record is never replayed blindly. Results
// are in input order; a Message repeating an earlier id in the same call is
// reported Busy with a Wait of one second.
func TakeOver(ctx context.Context, db pgoutbox.DB, msgs []Message, owner string, lease time.Duration) ([]Result, error) {
	out := make([]Result, len(msgs))
	reqs := make([]store.TakeOverReq, 0, len(msgs))
	at := make([]int, 0, len(msgs))
	seen := make(map[int64]bool, len(msgs))
	for i, m := range msgs {
		if seen[m.ID] {
			out[i] = Result{Action: Busy, Wait: time.Second}
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
	res, err := store.TakeOver(ctx, db, reqs, Owner, owner, lease)
	if err != nil {
		return nil, fmt.Errorf("handoff: take over: %w", err)
	}
	for j, r := range res {
		tr := Result{State: pgoutbox.State(r.State), Wait: r.Wait}
		switch r.Action {
		case store.TakeTaken:
			tr.Action, tr.Lease = Taken, newLease(r.Claimed)
		case store.TakeSettled:
			tr.Action = Settled
		case store.TakeReconcile:
			tr.Action = Reconciled
		case store.TakeExhausted:
			tr.Action = Exhausted
		case store.TakeMissing:
			tr.Action = Missing
		default:
			tr.Action = Busy
		}
		out[at[j]] = tr
	}
	return out, nil
}

// RetryHorizon is the longest time an effect handed to a broker may keep
// being delivered: maxAttempts attempts (default
// pgoutbox.MaxAttemptsDefault when not positive), each taking at most
// perAttempt (a consumer's lease: a crashed consumer's effect is taken over
// when its lease expires) and followed by the largest backoff (2^attempt s
// capped at backoffCap, default pgoutbox.BackoffCapDefault when not
// positive, +10 % jitter), plus one more perAttempt for the last
// redelivery. A broker's duplicate window must be at least this long, so
// that the relay publishing an effect again within it (after a relay crash,
// or when a hand-over lease expires) never stores a second message.
func RetryHorizon(maxAttempts int, backoffCap, perAttempt time.Duration) time.Duration {
	if maxAttempts <= 0 {
		maxAttempts = pgoutbox.MaxAttemptsDefault
	}
	if backoffCap <= 0 {
		backoffCap = pgoutbox.BackoffCapDefault
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
