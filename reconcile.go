package pgoutbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// ErrNotReconcilable is returned when an effect is not a reconciliation
// record of the expected type.
var ErrNotReconcilable = errors.New("pgoutbox: not a reconciliation_required effect of that type")

// EffectRow is an effect as stored in pgoutbox.effects, as operators see it:
// what GetEffect and ListEffects return.
type EffectRow struct {
	// ID is the effect's id (what Enqueue returned).
	ID int64 `json:"id"`
	// Queue, Type and Key are the effect's queue, effect type and
	// idempotency key, as enqueued.
	Queue string `json:"queue"`
	Type  string `json:"effect_type"`
	Key   string `json:"idempotency_key"`
	// State is where the effect is now (docs/design.md, "States").
	State State `json:"state"`
	// Attempts counts the deliveries started so far; MaxAttempts is the
	// attempt after which a failure dead-letters.
	Attempts    int `json:"attempts"`
	MaxAttempts int `json:"max_attempts"`
	// Payload is the effect's JSON payload; it is left out of the JSON
	// encoding of an EffectRow.
	Payload json.RawMessage `json:"-"`
	// CreatedAt is when the enqueuing transaction wrote the effect.
	CreatedAt time.Time `json:"created_at"`
	// DeliveryStartedAt is when the delivery of a type that is not
	// replay-safe started; nil otherwise.
	DeliveryStartedAt *time.Time `json:"delivery_started_at,omitempty"`
	// LastError is the error of the last failed attempt; empty if none.
	LastError string `json:"last_error,omitempty"`
}

func effectRowOf(r store.Record) EffectRow {
	out := EffectRow{ID: r.ID, Queue: r.Queue, Type: r.Type, Key: r.Key, State: State(r.State), Attempts: r.Attempts,
		MaxAttempts: r.MaxAttempts, Payload: r.Payload, CreatedAt: r.CreatedAt, DeliveryStartedAt: r.DeliveryStartedAt}
	if r.LastError != nil {
		out.LastError = *r.LastError
	}
	return out
}

// GetEffect loads the effect with id; ok is false when no such effect exists
// (never enqueued, or pruned after CompletedRetention).
func GetEffect(ctx context.Context, db DB, id int64) (row EffectRow, ok bool, err error) {
	r, ok, err := store.Get(ctx, db, id)
	if err != nil {
		return EffectRow{}, false, fmt.Errorf("pgoutbox: get effect %d: %w", id, err)
	}
	return effectRowOf(r), ok, nil
}

// ListEffects lists up to limit effects in state (of queue, when queue is not
// empty), oldest first; a limit of zero lists none.
func ListEffects(ctx context.Context, db DB, state State, queue string, limit int) ([]EffectRow, error) {
	rs, err := store.ListState(ctx, db, string(state), queue, limit)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: list %s: %w", state, err)
	}
	out := make([]EffectRow, len(rs))
	for i, r := range rs {
		out[i] = effectRowOf(r)
	}
	return out, nil
}

// Resolve closes a reconciliation_required effect of effectType as
// completed, recording the operator's resolution (any JSON-encodable value,
// without secrets). Run it in the transaction that applies the resolution's
// consequences. Only an operator resolves; the engine never does.
func Resolve(ctx context.Context, db DB, id int64, effectType string, resolution any) error {
	b, err := json.Marshal(resolution)
	if err != nil {
		return fmt.Errorf("pgoutbox: resolution: %w", err)
	}
	ok, err := store.Resolve(ctx, db, id, effectType, b)
	if err != nil {
		return fmt.Errorf("pgoutbox: resolve %d: %w", id, err)
	}
	if !ok {
		return fmt.Errorf("pgoutbox: resolve %d: %w", id, ErrNotReconcilable)
	}
	return nil
}
