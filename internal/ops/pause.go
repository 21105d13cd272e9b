package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Bounds of what an operator types into a pause or a cancel (the columns'
// CHECKs of migration 00023 and the resolution's size).
const (
	QueueNameMax   = 128
	OperatorMax    = 200
	ReasonMax      = 500
	CancelBatchMax = 1000
)

// ErrBadInput is wrapped by the refusals of an operator's input (an empty
// or too long queue name, reason or label); nothing was changed.
var ErrBadInput = errors.New("ops: invalid input")

// QueuePause is one paused queue: who paused it, when and why. Claims of
// its effects stop (both lease modes, the NATS relay) until it is resumed;
// enqueues go on.
type QueuePause struct {
	Queue  string    `json:"queue"`
	By     string    `json:"paused_by"`
	At     time.Time `json:"paused_at"`
	Reason string    `json:"reason"`
	// Already: the queue was paused before (nothing changed).
	Already bool `json:"already_paused,omitempty"`
}

// PauseOptions is one pause or resume.
type PauseOptions struct {
	Queue string
	// By is who pauses (the console's operator label, the CLI's --by);
	// required on a pause.
	By string
	// Reason is optional free text (at most ReasonMax runes).
	Reason string
	// Then, when set, runs in the pause's (or resume's) transaction after
	// the change and before the commit, as ReplayOptions.Then: the
	// console's audit row commits with the change or not at all. changed
	// says whether anything changed (false: already paused, or not paused).
	Then func(ctx context.Context, tx pgx.Tx, p QueuePause, changed bool) error
}

// Check reports, wrapped in ErrBadInput, what is out of bounds in a pause
// (pause true) or a resume; PauseQueue and ResumeQueue run it first, and
// the console runs it before its confirmation page.
func (o PauseOptions) Check(pause bool) error {
	switch {
	case strings.TrimSpace(o.Queue) == "" || len(o.Queue) > QueueNameMax:
		return fmt.Errorf("%w: a queue name of 1..%d bytes is required", ErrBadInput, QueueNameMax)
	case pause && (strings.TrimSpace(o.By) == "" || len([]rune(o.By)) > OperatorMax):
		return fmt.Errorf("%w: who pauses (1..%d characters) is required", ErrBadInput, OperatorMax)
	case len([]rune(o.Reason)) > ReasonMax:
		return fmt.Errorf("%w: the reason is longer than %d characters", ErrBadInput, ReasonMax)
	}
	return nil
}

// PauseQueue pauses a queue: from its commit no claim takes the queue's
// effects until ResumeQueue (a delivery in progress finishes). The pause is
// a row of pgoutbox.queue_pauses, so it survives restarts and holds for
// every process. Pausing a paused queue changes nothing (Already set).
// A queue with no effects yet may be paused (before its first enqueue).
func PauseQueue(ctx context.Context, pool *pgxpool.Pool, o PauseOptions) (QueuePause, error) {
	if err := o.Check(true); err != nil {
		return QueuePause{}, err
	}
	var out QueuePause
	err := inTx(ctx, pool, false, func(tx pgx.Tx) error {
		p, err := store.PauseQueue(ctx, tx, o.Queue, o.By, o.Reason)
		if err != nil {
			return err
		}
		out = QueuePause{Queue: p.Queue, By: p.By, At: p.At, Reason: p.Reason, Already: p.Existing}
		if o.Then != nil {
			return o.Then(ctx, tx, out, !p.Existing)
		}
		return nil
	})
	if err != nil {
		return QueuePause{}, fmt.Errorf("ops: pause queue %q: %w", o.Queue, err)
	}
	return out, nil
}

// ResumeQueue deletes a queue's pause and wakes its workers. paused=false:
// the queue was not paused (nothing changed).
func ResumeQueue(ctx context.Context, pool *pgxpool.Pool, o PauseOptions) (p QueuePause, paused bool, err error) {
	if err := o.Check(false); err != nil {
		return QueuePause{}, false, err
	}
	err = inTx(ctx, pool, false, func(tx pgx.Tx) error {
		sp, found, err := store.ResumeQueue(ctx, tx, o.Queue)
		if err != nil {
			return err
		}
		p, paused = QueuePause{Queue: o.Queue, By: sp.By, At: sp.At, Reason: sp.Reason}, found
		if o.Then != nil {
			return o.Then(ctx, tx, p, found)
		}
		return nil
	})
	if err != nil {
		return QueuePause{}, false, fmt.Errorf("ops: resume queue %q: %w", o.Queue, err)
	}
	return p, paused, nil
}

// PausedQueues returns every paused queue by name.
func PausedQueues(ctx context.Context, db store.DBTX) ([]QueuePause, error) {
	ps, err := store.Pauses(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("ops: paused queues: %w", err)
	}
	out := make([]QueuePause, len(ps))
	for i, p := range ps {
		out[i] = QueuePause{Queue: p.Queue, By: p.By, At: p.At, Reason: p.Reason}
	}
	return out, nil
}

// CancelOptions selects the effects to cancel.
type CancelOptions struct {
	// IDs are the effects (1..CancelBatchMax).
	IDs []int64
	// By (required) and Reason are recorded in each cancelled effect's
	// resolution.
	By, Reason string
	// DryRun reports what would be cancelled and changes nothing.
	DryRun bool
	// Then runs in the cancel's transaction before the commit (the
	// console's audit), as ReplayOptions.Then; in a dry run it runs and is
	// rolled back.
	Then func(ctx context.Context, tx pgx.Tx, res *CancelResult) error
}

// Check reports, wrapped in ErrBadInput, what is out of bounds in a
// cancel; CancelEffects runs it first.
func (o CancelOptions) Check() error {
	switch {
	case len(o.IDs) == 0 || len(o.IDs) > CancelBatchMax:
		return fmt.Errorf("%w: cancel 1..%d effects at a time, not %d", ErrBadInput, CancelBatchMax, len(o.IDs))
	case strings.TrimSpace(o.By) == "" || len([]rune(o.By)) > OperatorMax:
		return fmt.Errorf("%w: who cancels (1..%d characters) is required", ErrBadInput, OperatorMax)
	case len([]rune(o.Reason)) > ReasonMax:
		return fmt.Errorf("%w: the reason is longer than %d characters", ErrBadInput, ReasonMax)
	}
	return nil
}

// CancelResult is what a cancel did (or, in a dry run, would do).
type CancelResult struct {
	DryRun bool `json:"dry_run"`
	// Cancelled are the effects now completed with a cancellation as their
	// resolution; State is the state each left.
	Cancelled []Moved   `json:"cancelled"`
	Skipped   []Skipped `json:"skipped"`
}

// CancelEffects cancels effects that should never run: an available
// effect (due, scheduled, retrying, or waiting behind its ordering key) or
// a dead letter, whose delivery never started. Each becomes completed, with
// {"cancelled": true, "by", "reason", "from_state", "at"} as its
// resolution, and is never delivered; as completed it releases its
// ordering key. Refused, and reported in Skipped: a leased effect (in
// delivery), one a row-lock claim is delivering right now, a
// reconciliation record, and any effect whose delivery started (a
// non-replay-safe request may have been sent: resolve it with `reconcile`).
func CancelEffects(ctx context.Context, pool *pgxpool.Pool, o CancelOptions) (*CancelResult, error) {
	if err := o.Check(); err != nil {
		return nil, err
	}
	res := &CancelResult{DryRun: o.DryRun, Cancelled: []Moved{}, Skipped: []Skipped{}}
	err := inTx(ctx, pool, o.DryRun, func(tx pgx.Tx) error {
		done, err := store.CancelEffects(ctx, tx, o.IDs, o.By, o.Reason)
		if err != nil {
			return err
		}
		moved := map[int64]bool{}
		for _, c := range done {
			moved[c.ID] = true
			res.Cancelled = append(res.Cancelled, Moved{ID: c.ID, Queue: c.Queue, Type: c.Type, State: c.From})
		}
		if res.Skipped, err = cancelSkipped(ctx, tx, o.IDs, moved); err != nil {
			return err
		}
		if o.Then != nil {
			return o.Then(ctx, tx, res)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ops: cancel effects: %w", err)
	}
	return res, nil
}

// cancelSkipped explains each requested id that was not cancelled.
func cancelSkipped(ctx context.Context, tx pgx.Tx, ids []int64, moved map[int64]bool) ([]Skipped, error) {
	cs, err := store.CancelCandidates(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	byID := map[int64]store.CancelCandidate{}
	for _, c := range cs {
		byID[c.ID] = c
	}
	out := []Skipped{}
	seen := map[int64]bool{}
	for _, id := range ids {
		if moved[id] || seen[id] {
			continue
		}
		seen[id] = true
		c, ok := byID[id]
		if !ok {
			out = append(out, Skipped{ID: id, State: "missing", Reason: "no such effect"})
			continue
		}
		out = append(out, Skipped{ID: id, State: c.State, Reason: CancelRefusal(c)})
	}
	return out, nil
}

// CancelRefusal says why c cannot be cancelled now ("" when it can).
func CancelRefusal(c store.CancelCandidate) string {
	switch {
	case c.State == "leased":
		return "in delivery (leased): wait for its outcome"
	case c.State == "reconciliation_required":
		return "a reconciliation record: resolve or supersede it (pgoutbox reconcile), never cancel it"
	case c.DeliveryStarted && c.State != "completed":
		return "its delivery started, so its request may have been sent: never cancelled"
	case c.State == "completed" && c.AlreadyCancelled:
		return "already cancelled"
	case c.State == "completed":
		return "already completed"
	case c.State == "available" || c.State == "dead_letter":
		return "held by a delivery in progress (a row-lock claim) or another operator's action: try again"
	}
	return "state " + c.State + " cannot be cancelled"
}
