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
// what GetEffect and ListEffects return. Payload is omitted from its JSON
// encoding; LastError is empty when no attempt failed and DeliveryStartedAt
// is nil unless delivery of a type that is not replay-safe started.
type EffectRow struct {
	ID                int64           `json:"id"`
	Queue             string          `json:"queue"`
	Type              string          `json:"effect_type"`
	Key               string          `json:"idempotency_key"`
	State             State           `json:"state"`
	Attempts          int             `json:"attempts"`
	MaxAttempts       int             `json:"max_attempts"`
	Payload           json.RawMessage `json:"-"`
	CreatedAt         time.Time       `json:"created_at"`
	DeliveryStartedAt *time.Time      `json:"delivery_started_at,omitempty"`
	LastError         string          `json:"last_error,omitempty"`
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
