package pgoutbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/engine"
)

// ErrLeaseLost is returned (wrapped) when a fenced complete, fail or extend
// matched no row: the lease expired and was recovered, or another worker holds
// the effect now. The row was not changed.
var ErrLeaseLost = errors.New("pgoutbox: lease lost")

// ErrPayloadTooLarge is matched (errors.Is) by *PayloadTooLargeError.
var ErrPayloadTooLarge = errors.New("pgoutbox: payload too large")

// ErrCredentialKey is matched (errors.Is) by *CredentialKeyError.
var ErrCredentialKey = errors.New("pgoutbox: payload carries a credential key")

// ErrInvalidEffect is matched (errors.Is) by *InvalidEffectError.
var ErrInvalidEffect = errors.New("pgoutbox: invalid effect")

// PayloadTooLargeError reports a payload over MaxPayloadBytes, as given or
// as stored.
type PayloadTooLargeError struct {
	// Size is the payload's encoded JSON size in bytes, as given; 0 when
	// Stored and the payload is one of a batch's (which one is not known).
	Size int
	// Limit is MaxPayloadBytes.
	Limit int
	// Stored is true when the payload fits as given but not as the
	// database stores it: jsonb's text spells numbers out (1e99 is 100
	// digits) and adds spaces.
	Stored bool
}

func (e *PayloadTooLargeError) Error() string {
	switch {
	case !e.Stored:
		return fmt.Sprintf("pgoutbox: payload is %d bytes, over the %d-byte limit", e.Size, e.Limit)
	case e.Size > 0:
		return fmt.Sprintf("pgoutbox: payload is %d bytes, but over the %d-byte limit as stored "+
			"(jsonb spells numbers out and adds spaces)", e.Size, e.Limit)
	}
	return fmt.Sprintf("pgoutbox: a payload of the batch is over the %d-byte limit as stored "+
		"(jsonb spells numbers out and adds spaces)", e.Limit)
}

// Is makes errors.Is(err, ErrPayloadTooLarge) true.
func (e *PayloadTooLargeError) Is(target error) bool { return target == ErrPayloadTooLarge }

// CredentialKeyError reports a payload key that looks like a credential. Path
// names the key (e.g. "$.auth.token"), never its value.
type CredentialKeyError struct {
	// Path is the key's JSON path, e.g. "$.auth.token".
	Path string
}

func (e *CredentialKeyError) Error() string {
	return fmt.Sprintf("pgoutbox: payload key %s looks like a credential; secrets must not be stored in effects", e.Path)
}

// Is makes errors.Is(err, ErrCredentialKey) true.
func (e *CredentialKeyError) Is(target error) bool { return target == ErrCredentialKey }

// InvalidEffectError names the Effect field that failed validation.
type InvalidEffectError struct {
	// Field is the Effect field (or "tx"), e.g. "Queue" or "Delay".
	Field string
	// Reason says what is wrong with it, e.g. "must be 1-128 characters".
	Reason string
}

func (e *InvalidEffectError) Error() string {
	return fmt.Sprintf("pgoutbox: invalid effect: %s %s", e.Field, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidEffect) true.
func (e *InvalidEffectError) Is(target error) bool { return target == ErrInvalidEffect }

// Outcome is how a delivery ended, as classified from a handler's error
// (the engine's type, as the root names it).
type Outcome = engine.Outcome

// Delivery outcomes (docs/design.md, "Delivery outcomes").
const (
	// OutcomeSuccess: delivered; the effect is completed.
	OutcomeSuccess Outcome = engine.OutcomeSuccess
	// OutcomeRetry: a transient failure; nothing was delivered. Retried with
	// backoff until max attempts, then dead-lettered.
	OutcomeRetry Outcome = engine.OutcomeRetry
	// OutcomeRetryAfter: like retry, no earlier than the given delay.
	OutcomeRetryAfter Outcome = engine.OutcomeRetryAfter
	// OutcomePermanent: dead-letter now.
	OutcomePermanent Outcome = engine.OutcomePermanent
	// OutcomeAmbiguous: the request may have been processed. A retry for a
	// replay-safe effect type; reconciliation_required otherwise.
	OutcomeAmbiguous Outcome = engine.OutcomeAmbiguous
	// OutcomeLeaseLost: the worker no longer held the lease when it tried to
	// record the outcome; nothing was written.
	OutcomeLeaseLost Outcome = engine.OutcomeLeaseLost
)

// OutcomeError carries a handler's classification of a failure. Build it
// with Retry, RetryAfter, Permanent or Ambiguous. Its fields: Outcome (the
// classification), After (the delay asked for with RetryAfter; zero for the
// others) and Err (the handler's error, recorded as the effect's
// last_error, and what Unwrap returns).
type OutcomeError = engine.OutcomeError

// Retry classifies err as transient with nothing delivered: the effect is
// retried with backoff. For a non-replay-safe effect it asserts that the
// request was not sent, so the effect may be sent again. A plain (unclassified)
// error is a retry for replay-safe types and ambiguous for the others.
func Retry(err error) error { return engine.Retry(err) }

// RetryAfter is Retry no earlier than d from now (database clock), or later
// if the backoff is longer. Use it for Retry-After and rate-limit resets.
func RetryAfter(d time.Duration, err error) error { return engine.RetryAfter(d, err) }

// Permanent classifies err as a permanent failure: the effect is
// dead-lettered now, whatever attempts remain.
func Permanent(err error) error { return engine.Permanent(err) }

// Ambiguous says the request may have been processed (a timeout or reset
// after sending, a 5xx to a non-idempotent call, a malformed 2xx). A
// replay-safe effect is retried; any other goes to reconciliation_required.
func Ambiguous(err error) error { return engine.Ambiguous(err) }
