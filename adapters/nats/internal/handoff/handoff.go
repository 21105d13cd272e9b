// Package handoff is the protocol by which the NATS relay and its consumers
// (adapters/nats) share the effects of PostgreSQL (docs/scale-out.md).
// PostgreSQL stays the source of truth and every transition stays fenced:
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
// It is built on the root package's public API only (ClaimRelayLeases,
// HandOver, TakeOver and the Lease's fenced writes): it names the hand-off
// marker and sizes the retry horizon. Nothing here is part of the library's
// API: an application uses adapters/nats.
package handoff

import (
	"context"
	"math"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Owner is the lease_owner of an effect that a relay handed over to a broker
// (or a consumer handed back for a retry): it is waiting in the broker for a
// consumer to take it over.
const Owner = "pgoutbox:handoff"

// Lease is an effect leased by a relay (ClaimRelay) or a consumer
// (TakeOver): every write through it is fenced by its lease, and a lease
// that was recovered or handed over returns pgoutbox.ErrLeaseLost and
// changes nothing.
type Lease = pgoutbox.Lease

// ClaimRelay leases up to limit available effects of queue for a relay
// (owner) until now()+lease, counting no delivery attempt
// (pgoutbox.ClaimRelayLeases).
func ClaimRelay(ctx context.Context, db pgoutbox.DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	return pgoutbox.ClaimRelayLeases(ctx, db, queue, owner, limit, lease)
}

// HandOver records that the broker accepted the relay's leases: each effect
// stays leased, owned by Owner under a fresh token, until now()+lease. It
// returns the ids handed over (pgoutbox.HandOver).
func HandOver(ctx context.Context, db pgoutbox.DB, leases []*Lease, lease time.Duration) (map[int64]bool, error) {
	return pgoutbox.HandOver(ctx, db, leases, Owner, lease)
}

// HandBack records that a consumer's attempt failed with nothing delivered
// and that the broker delivers the effect again: it stays leased, owned by
// Owner, until now()+lease (pgoutbox.Lease.HandBack).
func HandBack(ctx context.Context, db pgoutbox.DB, l *Lease, lease time.Duration, herr error) error {
	return l.HandBack(ctx, db, Owner, lease, herr)
}

// Message names the effect a broker message carries.
type Message = pgoutbox.BrokerMessage

// Action says what TakeOver did with one Message; its value is the metric
// label adapters/nats records.
type Action = pgoutbox.TakeOverAction

// Take-over actions (pgoutbox.TakeOverAction).
const (
	Taken      = pgoutbox.TakeOverTaken
	Settled    = pgoutbox.TakeOverSettled
	Busy       = pgoutbox.TakeOverBusy
	Reconciled = pgoutbox.TakeOverReconciled
	Exhausted  = pgoutbox.TakeOverExhausted
	Missing    = pgoutbox.TakeOverMissing
)

// Result is the outcome of one Message.
type Result = pgoutbox.TakeOverResult

// TakeOver gives owner a lease of duration lease on each effect a consumer
// may deliver now (handed over to Owner, still leased by the relay claim
// that published the message, expired, or available and due), in one
// statement, and routes the others (pgoutbox.TakeOver).
func TakeOver(ctx context.Context, db pgoutbox.DB, msgs []Message, owner string, lease time.Duration) ([]Result, error) {
	return pgoutbox.TakeOver(ctx, db, msgs, Owner, owner, lease)
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
