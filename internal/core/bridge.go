package core

import "time"

// Bridge is what the root package (which owns EffectType and Delivery, and
// classifies handler errors) gives this package's tests, so that they
// deliver exactly as a Client does. Everything outside the root delivers
// through its public API (Lease.Deliver). T is pgoutbox.EffectType, D
// pgoutbox.Delivery.
type Bridge[T, D any] struct {
	// Job is the job that delivers d with t (the zero T: an unregistered
	// type, retried) within timeout; the caller sets its Fence.
	Job func(t T, d *D, timeout time.Duration) *Job
	// Route classifies a handler's error with backoff capped at backoffCap.
	Route func(backoffCap time.Duration) func(err error, replaySafe bool, attempt int) Route
	// Transient marks an engine error as a retry.
	Transient func(error) error
}

var bridge any

// Provide registers the root package's Bridge; the root calls it in init.
func Provide[T, D any](b Bridge[T, D]) { bridge = b }

// Root returns the Bridge the root package registered. It panics when T
// and D are not the root's types (a programming error).
func Root[T, D any]() Bridge[T, D] { return bridge.(Bridge[T, D]) }
