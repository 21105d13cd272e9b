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

// Record is an effect as operators see it.
type Record struct {
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

func recordOf(r store.Record) Record {
	out := Record{ID: r.ID, Queue: r.Queue, Type: r.Type, Key: r.Key, State: State(r.State), Attempts: r.Attempts,
		MaxAttempts: r.MaxAttempts, Payload: r.Payload, CreatedAt: r.CreatedAt, DeliveryStartedAt: r.DeliveryStartedAt}
	if r.LastError != nil {
		out.LastError = *r.LastError
	}
	return out
}

// GetRecord loads one effect; ok=false when it does not exist.
func GetRecord(ctx context.Context, db DB, id int64) (Record, bool, error) {
	r, ok, err := store.Get(ctx, db, id)
	if err != nil {
		return Record{}, false, fmt.Errorf("pgoutbox: get effect %d: %w", id, err)
	}
	return recordOf(r), ok, nil
}

// ListRecords lists up to limit effects in state (of queue, when not empty),
// oldest first.
func ListRecords(ctx context.Context, db DB, state State, queue string, limit int) ([]Record, error) {
	rs, err := store.ListState(ctx, db, string(state), queue, limit)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: list %s: %w", state, err)
	}
	out := make([]Record, len(rs))
	for i, r := range rs {
		out[i] = recordOf(r)
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
