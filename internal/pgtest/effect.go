package pgtest

import (
	"context"
	"testing"
	"time"
)

// Effect is the externally visible part of one pgoutbox.effects row, what
// the engine's and the hand-off's tests check after each step.
type Effect struct {
	State    string
	Attempts int
	// Token is the lease token, nil when not leased.
	Token   *string
	Expires *time.Time
	Started *time.Time
	// AvailableIn is available_at - now(), in seconds (+Inf for a parked
	// effect, whose available_at is infinity: migration 00014).
	AvailableIn float64
	LastError   *string
}

// ReadEffect loads effect id from pgoutbox.effect_states (either storage,
// migration 00027); any error (a missing row too) fails the test.
func ReadEffect(tb testing.TB, ctx context.Context, db Querier, id int64) Effect {
	tb.Helper()
	var e Effect
	err := db.QueryRow(ctx, `
		SELECT state::text, attempts, lease_token::text, lease_expires_at, delivery_started_at,
		       (extract(epoch FROM available_at) - extract(epoch FROM now()))::float8, last_error
		FROM pgoutbox.effect_states WHERE id = $1`, id).
		Scan(&e.State, &e.Attempts, &e.Token, &e.Expires, &e.Started, &e.AvailableIn, &e.LastError)
	if err != nil {
		tb.Fatalf("effect %d: %v", id, err)
	}
	return e
}

// EffectJSON returns the whole row of effect id as JSON, to prove that a
// write changed nothing; any error fails the test.
func EffectJSON(tb testing.TB, ctx context.Context, db Querier, id int64) string {
	tb.Helper()
	var s string
	if err := db.QueryRow(ctx, `SELECT to_jsonb(e)::text FROM pgoutbox.effects e WHERE id = $1`, id).Scan(&s); err != nil {
		tb.Fatalf("effect %d: %v", id, err)
	}
	return s
}
