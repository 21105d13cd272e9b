package engine_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Backoff is 2^attempt s ±10 %, and the cap bounds the jittered wait: no
// wait exceeds it (defect 7 of issue #11: the jitter was added after the
// cap, so waits reached 330 s).
func TestBackoff(t *testing.T) {
	t.Parallel()
	const limit = 300 * time.Second
	for attempt, want := range map[int]time.Duration{1: 2 * time.Second, 3: 8 * time.Second, 8: 256 * time.Second, 9: 300 * time.Second, 20: 300 * time.Second} {
		high := min(want*11/10, limit)
		for range 1000 {
			got := engine.Backoff(attempt, limit)
			if got < want*9/10 || got > high {
				t.Fatalf("Backoff(%d) = %s, want %s ±10%% and at most the cap %s", attempt, got, want, limit)
			}
		}
	}
}

// RouteOf classifies a handler's error once into a typed outcome and the
// store write it leads to; a wrapped classification is found, and an
// unclassified error is a retry only for a replay-safe type.
func TestRouteOf(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	const backoffCap = time.Minute
	for _, c := range []struct {
		name       string
		err        error
		replaySafe bool
		outcome    engine.Outcome
		kind       store.FailKind
	}{
		{"plain, replay-safe", boom, true, engine.OutcomeRetry, store.FailRetry},
		{"plain, not replay-safe", boom, false, engine.OutcomeAmbiguous, store.FailReconcile},
		{"retry, not replay-safe", engine.Retry(boom), false, engine.OutcomeRetry, store.FailRetry},
		{"retry after", engine.RetryAfter(time.Second, boom), false, engine.OutcomeRetryAfter, store.FailRetry},
		{"permanent", fmt.Errorf("wrapped: %w", engine.Permanent(boom)), true, engine.OutcomePermanent, store.FailDeadLetter},
		{"ambiguous, replay-safe", engine.Ambiguous(boom), true, engine.OutcomeAmbiguous, store.FailRetry},
		{"ambiguous, not replay-safe", engine.Ambiguous(boom), false, engine.OutcomeAmbiguous, store.FailReconcile},
	} {
		r := engine.RouteOf(c.err, c.replaySafe, 1, backoffCap)
		if r.Outcome != c.outcome || r.Kind != c.kind {
			t.Errorf("%s: routed to (%s, %v), want (%s, %v)", c.name, r.Outcome, r.Kind, c.outcome, c.kind)
		}
	}
	// A Retry-After beyond both caps is cut to the larger of them.
	if r := engine.RouteOf(engine.RetryAfter(100*time.Hour, boom), true, 1, backoffCap); r.Delay != engine.RetryAfterCap {
		t.Errorf("RetryAfter(100h) delayed %s, want RetryAfterCap %s", r.Delay, engine.RetryAfterCap)
	}
}
