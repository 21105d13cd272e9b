package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// HistoryAttemptsDefault is how many recorded attempts (and console
// actions) [EffectHistory] reads by default: the newest.
const HistoryAttemptsDefault = 200

// History is one effect's timeline (`pgoutbox effect history`, the
// console's effect page): what the row and pgoutbox.effect_attempts
// (migration 00012) recorded, and the console actions that named it
// (pgoutbox.console_audit), oldest first.
type History struct {
	ID          int64  `json:"id"`
	Queue       string `json:"queue"`
	Type        string `json:"effect_type"`
	Key         string `json:"idempotency_key"`
	State       string `json:"state"`
	Attempts    int    `json:"attempts"`
	MaxAttempts int    `json:"max_attempts"`
	// Storage is "rows" (a row of pgoutbox.effects) or "batch" (a batch
	// queue's effect still in pgoutbox.stream: its state is that of its
	// batch, pgoutbox.effect_states, and it has no claim, attempt or
	// error of its own until a failure moves it to pgoutbox.effects).
	Storage string `json:"storage"`
	// LastError is the effect's last_error, raw: redact it before showing
	// it (the console's RedactError).
	LastError string `json:"last_error,omitempty"`
	// Resolution is the operator's recorded resolution of a
	// reconciliation record (JSON, raw: redact it before showing it), nil
	// when none.
	Resolution json.RawMessage `json:"resolution,omitempty"`
	// Events is the timeline, oldest first.
	Events []HistoryEvent `json:"events"`
	// Cut: more than the limit of attempts or actions is recorded; only
	// the newest are in Events.
	Cut bool `json:"cut,omitempty"`
	// Effect is the row as read, raw (the console's effect page shows it
	// all); not in the JSON, whose fields above say what it holds.
	Effect store.EffectDetail `json:"-"`
}

// Cancellation is the resolution a cancel records ([CancelEffects]).
type Cancellation struct {
	Cancelled bool   `json:"cancelled"`
	By        string `json:"by"`
	Reason    string `json:"reason"`
	From      string `json:"from_state"`
}

// CancellationOf reads a cancellation from an effect's resolution, nil
// when it is none (no resolution, or another resolution).
func CancellationOf(resolution []byte) *Cancellation {
	var c Cancellation
	if len(resolution) == 0 || json.Unmarshal(resolution, &c) != nil || !c.Cancelled {
		return nil
	}
	return &c
}

// HistoryEvent is one line of an effect's timeline.
type HistoryEvent struct {
	At time.Time `json:"at"`
	// Kind is enqueued, attempt_failed, replayed, claimed,
	// delivery_started, completed (also a cancel: "cancelled by …"),
	// dead_lettered, reconciliation_required or operator (a console
	// action: replay, resolve, supersede, cancel).
	Kind string `json:"kind"`
	// What says it in words: "attempt 2 failed → retrying".
	What string `json:"what"`
	// Failed marks a failure.
	Failed bool `json:"failed,omitempty"`
	// Worker is the lease owner of an attempt or claim.
	Worker string `json:"worker,omitempty"`
	// Operator is who acted, for an operator event.
	Operator string `json:"operator,omitempty"`
	// Detail is an attempt's error (raw: redact it before showing it) or
	// an operator action's recorded outcome.
	Detail string `json:"detail,omitempty"`
}

// EffectHistory reads effect id's timeline with at most limit recorded
// attempts and limit console actions, the newest (limit ≤ 0:
// HistoryAttemptsDefault), from either storage (store.GetEffectDetail: a
// row of pgoutbox.effects, else a batch queue's effect in the stream with
// its pgoutbox.effect_states state). found is false when no effect has
// that id (a completed effect is gone once pruned, a stream effect once
// its generation is truncated).
func EffectHistory(ctx context.Context, db store.DBTX, id int64, limit int) (h *History, found bool, err error) {
	if limit <= 0 {
		limit = HistoryAttemptsDefault
	}
	e, ok, err := store.GetEffectDetail(ctx, db, id)
	if err != nil || !ok {
		if err != nil {
			err = fmt.Errorf("ops: effect history: %w", err)
		}
		return nil, false, err
	}
	attempts, err := store.ListAttempts(ctx, db, id, limit+1)
	if err != nil {
		return nil, true, fmt.Errorf("ops: effect history: %w", err)
	}
	audit, err := store.ListEffectAudit(ctx, db, id, limit+1)
	if err != nil {
		return nil, true, fmt.Errorf("ops: effect history: %w", err)
	}
	h = &History{ID: e.ID, Queue: e.Queue, Type: e.Type, Key: e.Key, State: e.State, Storage: e.Storage,
		Attempts: e.Attempts, MaxAttempts: e.MaxAttempts, Effect: e}
	if e.LastError != nil {
		h.LastError = *e.LastError
	}
	if e.Resolution != nil {
		h.Resolution = json.RawMessage(e.Resolution)
	}
	if len(attempts) > limit {
		attempts, h.Cut = attempts[1:], true
	}
	if len(audit) > limit {
		audit, h.Cut = audit[1:], true
	}
	h.Events = timeline(e, attempts, audit)
	return h, true, nil
}

// timeline merges the row's timestamps, the recorded attempts and the
// console actions (the one timeline: the CLI's and the console's), oldest first (a stable sort: an attempt that
// dead-lettered the effect comes before the row's dead_lettered_at of the
// same instant).
func timeline(e store.EffectDetail, attempts []store.Attempt, audit []store.AuditEntry) []HistoryEvent {
	ev := []HistoryEvent{{At: e.CreatedAt, Kind: "enqueued", What: "enqueued"}}
	for _, a := range attempts {
		x := HistoryEvent{At: a.At, Kind: "attempt_failed", Worker: a.Worker, Detail: a.Error, Failed: true}
		switch a.Outcome {
		case "replayed":
			by := "an operator"
			if a.Worker != "" { // ReplayOptions.By
				by, x.Worker = a.Worker, ""
			}
			x.Kind, x.Failed = "replayed", false
			x.What = fmt.Sprintf("replayed by %s after %d attempt(s): attempts start again", by, a.Attempt)
		case "retrying":
			x.What = fmt.Sprintf("attempt %d failed → retrying", a.Attempt)
		default:
			x.What = fmt.Sprintf("attempt %d failed → %s", a.Attempt, a.Outcome)
		}
		ev = append(ev, x)
	}
	add := func(t *time.Time, kind, what, worker string) {
		if t != nil {
			ev = append(ev, HistoryEvent{At: *t, Kind: kind, What: what, Worker: worker})
		}
	}
	owner := ""
	if e.LeaseOwner != nil {
		owner = *e.LeaseOwner
	}
	add(e.LeasedAt, "claimed", fmt.Sprintf("claimed (attempt %d, the latest claim)", e.Attempts), owner)
	add(e.DeliveryStartedAt, "delivery_started", "delivery started", "")
	if c := CancellationOf(e.Resolution); c != nil {
		what := "cancelled by " + c.By + " (never delivered)"
		if c.Reason != "" {
			what += ": " + c.Reason
		}
		add(e.CompletedAt, "completed", what, "")
	} else if e.Resolution != nil {
		add(e.CompletedAt, "completed", "completed by an operator's resolution", "")
	} else if e.Storage == store.StorageBatch {
		add(e.CompletedAt, "completed", "completed (delivered from its batch, settled)", "")
	} else {
		add(e.CompletedAt, "completed", "completed", "")
	}
	add(e.DeadLetteredAt, "dead_lettered", "dead-lettered", "")
	add(e.ReconciliationAt, "reconciliation_required", "reconciliation required", "")
	for _, a := range audit {
		ev = append(ev, HistoryEvent{At: a.At, Kind: "operator", Operator: a.Operator, Detail: a.Outcome,
			What: fmt.Sprintf("%s by %s in the console (%s)", a.Action, a.Operator, a.Target)})
	}
	slices.SortStableFunc(ev, func(a, b HistoryEvent) int { return a.At.Compare(b.At) })
	return ev
}
