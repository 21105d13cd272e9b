package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// BlockedLimitDefault is the most keys `blocked-keys` lists.
const BlockedLimitDefault = 100

// BlockedMaxDefault is how long a key may be blocked (the age of its oldest
// waiting effect) before `blocked-keys --check` fails.
const BlockedMaxDefault = 15 * time.Minute

// BlockedOptions selects the ordering keys [BlockedKeys] lists.
type BlockedOptions struct {
	// Queue narrows the listing to one queue (default: every queue).
	Queue string
	// StuckOnly keeps the keys whose head waits for an operator: a strict
	// dead letter (replay it) or a reconciliation record (resolve it).
	StuckOnly bool
	// Limit caps the listing; ≤ 0 means BlockedLimitDefault.
	Limit int
}

// BlockedKey is one ordering key whose later effects wait for its head.
type BlockedKey struct {
	Queue       string `json:"queue"`
	OrderingKey string `json:"ordering_key"`
	// HeadID is the effect that holds the key back; HeadState says why
	// (Reason spells it out).
	HeadID        int64     `json:"head_id"`
	HeadType      string    `json:"head_effect_type"`
	HeadState     string    `json:"head_state"`
	HeadAttempts  int       `json:"head_attempts"`
	HeadLastError string    `json:"head_last_error,omitempty"`
	HeadDueAt     time.Time `json:"head_available_at"`
	Reason        string    `json:"reason"`
	// Stuck is true when only an operator can unblock the key.
	Stuck bool `json:"stuck"`
	// Waiting counts the later effects of the key that are not completed;
	// OldestWaitingSeconds is the age of the oldest.
	Waiting              int64   `json:"waiting"`
	OldestWaitingSeconds float64 `json:"oldest_waiting_seconds"`
}

// BlockedResult is what [BlockedKeys] found.
type BlockedResult struct {
	Keys []BlockedKey `json:"keys"`
	// Stuck counts the listed keys that wait for an operator.
	Stuck int `json:"stuck"`
}

// BlockedKeys lists the ordering keys with effects waiting behind an
// earlier effect of the same queue and key, longest waiting first, and what
// holds each back (docs/design.md, "Per-key ordering").
func BlockedKeys(ctx context.Context, pool *pgxpool.Pool, o BlockedOptions) (*BlockedResult, error) {
	if o.Limit <= 0 {
		o.Limit = BlockedLimitDefault
	}
	rows, err := store.BlockedKeys(ctx, pool, o.Queue, o.StuckOnly, o.Limit)
	if err != nil {
		return nil, fmt.Errorf("ops: blocked keys: %w", err)
	}
	now := time.Now()
	res := &BlockedResult{Keys: make([]BlockedKey, 0, len(rows))}
	for _, r := range rows {
		k := BlockedKey{
			Queue: r.Queue, OrderingKey: r.OrderingKey, HeadID: r.HeadID, HeadType: r.HeadType,
			HeadState: r.HeadState, HeadAttempts: r.HeadAttempts, HeadDueAt: r.HeadAvailableAt,
			Waiting: r.Waiting, OldestWaitingSeconds: max(0, now.Sub(r.OldestWaiting).Seconds()),
		}
		if r.HeadLastError != nil {
			k.HeadLastError = *r.HeadLastError
		}
		k.Reason, k.Stuck = blockReason(r, now), r.Stuck()
		if k.Stuck {
			res.Stuck++
		}
		res.Keys = append(res.Keys, k)
	}
	return res, nil
}

// blockReason says in words why the head holds its key back.
func blockReason(r store.BlockedKey, now time.Time) string {
	switch r.HeadState {
	case "leased":
		return "in delivery"
	case "available":
		switch {
		case r.HeadAvailableAt.After(now) && r.HeadAttempts > 0:
			return "retrying"
		case r.HeadAvailableAt.After(now):
			return "scheduled"
		default:
			return "next to deliver"
		}
	case "dead_letter":
		return "dead letter (strict): replay it"
	case "reconciliation_required":
		return "reconciliation required: resolve it"
	}
	return r.HeadState
}
