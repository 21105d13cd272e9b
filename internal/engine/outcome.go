package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Outcome is how a delivery ended, as classified from a handler's error
// (the root package's Outcome).
type Outcome string

// Delivery outcomes (docs/design.md, "Delivery outcomes").
const (
	// OutcomeSuccess: delivered; the effect is completed.
	OutcomeSuccess Outcome = "success"
	// OutcomeRetry: a transient failure; nothing was delivered. Retried with
	// backoff until max attempts, then dead-lettered.
	OutcomeRetry Outcome = "retry"
	// OutcomeRetryAfter: like retry, no earlier than the given delay.
	OutcomeRetryAfter Outcome = "retry_after"
	// OutcomePermanent: dead-letter now.
	OutcomePermanent Outcome = "permanent"
	// OutcomeAmbiguous: the request may have been processed. A retry for a
	// replay-safe effect type; reconciliation_required otherwise.
	OutcomeAmbiguous Outcome = "ambiguous"
	// OutcomeLeaseLost: the worker no longer held the lease when it tried to
	// record the outcome; nothing was written.
	OutcomeLeaseLost Outcome = "lease_lost"
)

// State is an effect's state (docs/design.md, "States"; the root package's
// State).
type State string

// Effect states.
const (
	// StateAvailable: waiting to be claimed, now or at its available_at
	// (a new effect, or one retrying after a backoff).
	StateAvailable State = "available"
	// StateLeased: claimed by a worker (or handed to a broker) under a
	// lease that a sweeper recovers once it expires.
	StateLeased State = "leased"
	// StateCompleted: delivered; pruned after Config.CompletedRetention.
	StateCompleted State = "completed"
	// StateDeadLetter: failed permanently or ran out of attempts; kept until
	// an operator replays it (pgoutbox dlq).
	StateDeadLetter State = "dead_letter"
	// StateReconciliationRequired: a delivery of a type that is not
	// replay-safe started and its outcome is unknown; kept until an
	// operator calls Resolve.
	StateReconciliationRequired State = "reconciliation_required"
)

// OutcomeError carries a handler's classification of a failure. Build it
// with Retry, RetryAfter, Permanent or Ambiguous.
type OutcomeError struct {
	// Outcome is the classification.
	Outcome Outcome
	// After is the delay asked for with RetryAfter; zero for the others.
	After time.Duration
	// Err is the handler's error, recorded as the effect's last_error.
	Err error
}

func (e *OutcomeError) Error() string {
	msg := "<nil>"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Outcome == OutcomeRetryAfter {
		return fmt.Sprintf("%s (retry after %s)", msg, e.After)
	}
	return fmt.Sprintf("%s (%s)", msg, e.Outcome)
}

func (e *OutcomeError) Unwrap() error { return e.Err }

// Retry classifies err as transient with nothing delivered (the root
// package's Retry).
func Retry(err error) error { return &OutcomeError{Outcome: OutcomeRetry, Err: err} }

// RetryAfter is Retry no earlier than d from now (the root package's
// RetryAfter).
func RetryAfter(d time.Duration, err error) error {
	return &OutcomeError{Outcome: OutcomeRetryAfter, After: d, Err: err}
}

// Permanent classifies err as a permanent failure (the root package's
// Permanent).
func Permanent(err error) error { return &OutcomeError{Outcome: OutcomePermanent, Err: err} }

// Ambiguous says the request may have been processed (the root package's
// Ambiguous).
func Ambiguous(err error) error { return &OutcomeError{Outcome: OutcomeAmbiguous, Err: err} }

// RetryAfterCap bounds the delay a handler asks for with RetryAfter (a
// Retry-After header, a rate-limit reset): a longer delay is cut to
// RetryAfterCap, or to the backoff cap when that is larger, so one bad
// header cannot park an effect for years.
const RetryAfterCap = time.Hour

// Classify maps a handler's error to an outcome for an effect type of the
// given replay safety, and the delay a RetryAfter asked for. An
// unclassified error is a retry for a replay-safe type and ambiguous for
// any other.
func Classify(err error, replaySafe bool) (Outcome, time.Duration) {
	if err == nil {
		return OutcomeSuccess, 0
	}
	var oe *OutcomeError
	if errors.As(err, &oe) {
		return oe.Outcome, oe.After
	}
	if replaySafe {
		return OutcomeRetry, 0
	}
	return OutcomeAmbiguous, 0
}

// Backoff is the delay before retry number attempt+1: 2^attempt seconds
// with ±10 % jitter, capped at limit. The cap applies after the jitter, so
// no wait exceeds limit; at the cap the waits spread over [0.9, 1] × limit.
func Backoff(attempt int, limit time.Duration) time.Duration {
	base := math.Min(math.Pow(2, float64(attempt))*float64(time.Second), float64(limit))
	jitter := 1 + (rand.Float64()*0.2 - 0.1)
	return time.Duration(math.Min(base*jitter, float64(limit)))
}

// Route is where a failed delivery goes.
type Route struct {
	// Outcome is the classified outcome.
	Outcome Outcome
	// Kind and Delay are the store.Fail arguments.
	Kind  store.FailKind
	Delay time.Duration
}

// RouteOf classifies herr once and routes it: retry with backoff (a
// RetryAfter wins when later, up to RetryAfterCap or backoffCap,
// whichever is larger), dead letter for a permanent failure, or
// reconciliation for an ambiguous outcome of a type that is not
// replay-safe.
func RouteOf(herr error, replaySafe bool, attempt int, backoffCap time.Duration) Route {
	outcome, after := Classify(herr, replaySafe)
	r := Route{Outcome: outcome, Kind: store.FailRetry, Delay: Backoff(attempt, backoffCap)}
	switch outcome {
	case OutcomeRetryAfter:
		r.Delay = max(r.Delay, min(after, max(RetryAfterCap, backoffCap)))
	case OutcomePermanent:
		r.Kind = store.FailDeadLetter
	case OutcomeAmbiguous:
		if !replaySafe {
			r.Kind = store.FailReconcile
		}
	}
	return r
}

// Transient marks an engine error (a failed write before the handler ran)
// as a retry.
func Transient(err error) error { return Retry(err) }
