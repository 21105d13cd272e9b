package ops

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Defaults of the dead-letter and requeue commands.
const (
	// ReplayBatchLimitDefault caps one replay (OUTBOX_REPLAY_BATCH_LIMIT).
	ReplayBatchLimitDefault = 100
	// ListLimitDefault is the page size of `dlq list`.
	ListLimitDefault = 50
	// RequeueLimitDefault caps one `requeue-stale` run.
	RequeueLimitDefault = 1000
)

// DeadLetter is one dead-lettered effect as shown to an operator. The
// payload is never shown, only its Subject.
type DeadLetter struct {
	ID             int64      `json:"id"`
	Queue          string     `json:"queue"`
	Type           string     `json:"effect_type"`
	Attempts       int        `json:"attempts"`
	MaxAttempts    int        `json:"max_attempts"`
	LastError      string     `json:"last_error"`
	DeadLetteredAt *time.Time `json:"dead_lettered_at"`
	CreatedAt      time.Time  `json:"created_at"`
	// Subject is what the effect is about (record, repository, release
	// run, attempt), read from those payload keys only.
	Subject Subject `json:"subject"`
}

// DeadLetterPage is one page of dead letters, by id.
type DeadLetterPage struct {
	Items []DeadLetter `json:"items"`
	// NextAfterID, when set, fetches the next page (--after-id).
	NextAfterID *int64 `json:"next_after_id,omitempty"`
}

// ListDeadLetters returns up to limit dead letters with id > afterID
// (limit ≤ 0: ListLimitDefault).
func ListDeadLetters(ctx context.Context, db store.DBTX, f Filter, afterID int64, limit int) (*DeadLetterPage, error) {
	if limit <= 0 {
		limit = ListLimitDefault
	}
	// One extra row tells whether another page exists.
	rows, err := store.DeadLetters(ctx, db, f.store(), afterID, limit+1)
	if err != nil {
		return nil, fmt.Errorf("ops: list dead letters: %w", err)
	}
	page := &DeadLetterPage{Items: make([]DeadLetter, 0, len(rows))}
	for i, r := range rows {
		if i == limit {
			next := page.Items[limit-1].ID
			page.NextAfterID = &next
			break
		}
		page.Items = append(page.Items, DeadLetter{
			ID: r.ID, Queue: r.Queue, Type: r.Type, Attempts: r.Attempts, MaxAttempts: r.MaxAttempts,
			LastError: r.LastError, DeadLetteredAt: r.DeadLetteredAt, CreatedAt: r.CreatedAt,
			Subject: ParseSubject(r.Subject),
		})
	}
	return page, nil
}

// Moved is an effect an operator command moved.
type Moved struct {
	ID    int64  `json:"id"`
	Queue string `json:"queue"`
	Type  string `json:"effect_type"`
	// State is where it went.
	State string `json:"state"`
	// LeaseOwner and LeaseHeldSeconds describe a requeued stalled lease.
	LeaseOwner       string  `json:"lease_owner,omitempty"`
	LeaseHeldSeconds float64 `json:"lease_held_seconds,omitempty"`
}

// Skipped is a requested id that was not replayed, and why.
type Skipped struct {
	ID int64 `json:"id"`
	// State is the effect's state, or "missing".
	State  string `json:"state"`
	Reason string `json:"reason"`
}

// ReplayResult is what a replay did (or, in a dry run, would do).
type ReplayResult struct {
	DryRun   bool      `json:"dry_run"`
	Limit    int       `json:"limit"`
	Replayed []Moved   `json:"replayed"`
	Skipped  []Skipped `json:"skipped"`
}

// ReplayOptions selects the dead letters to replay.
type ReplayOptions struct {
	// Filter narrows the replay (default: every queue and type).
	Filter Filter
	// IDs, when set, restricts the replay to these effects.
	IDs []int64
	// Limit caps the replay; ≤ 0 means ReplayBatchLimitDefault.
	Limit int
	// DryRun reports what would be replayed and changes nothing.
	DryRun bool
	// By, when set, names who replays in each replayed effect's history
	// (the replay row of pgoutbox.effect_attempts), as the console's
	// timeline and `effect history` show it; empty: "an operator".
	By string
	// Then, when set, runs in the replay's transaction once the rows have
	// moved, before the commit (the console records its audit row there,
	// so the replay and its record commit or roll back together). An error
	// rolls the replay back. In a dry run it runs too, and is rolled back.
	Then func(ctx context.Context, tx pgx.Tx, res *ReplayResult) error
}

// ReplayDeadLetters moves dead letters back to available with fresh
// attempts (attempts = 0, due now) and wakes their queues' workers. Only
// dead_letter rows move; a requested id in any other state (notably
// reconciliation_required) is reported in Skipped and left untouched.
func ReplayDeadLetters(ctx context.Context, pool *pgxpool.Pool, o ReplayOptions) (*ReplayResult, error) {
	if o.Limit <= 0 {
		o.Limit = ReplayBatchLimitDefault
	}
	res := &ReplayResult{DryRun: o.DryRun, Limit: o.Limit, Replayed: []Moved{}, Skipped: []Skipped{}}
	err := inTx(ctx, pool, o.DryRun, func(tx pgx.Tx) error {
		moved, err := store.ReplayDeadLetters(ctx, tx, o.IDs, o.Filter.store(), o.Limit)
		if err != nil {
			return err
		}
		res.Replayed = toMoved(moved)
		if o.By != "" && len(moved) > 0 {
			ids := make([]int64, len(moved))
			for i, m := range moved {
				ids[i] = m.ID
			}
			if err := store.NameReplays(ctx, tx, ids, o.By); err != nil {
				return err
			}
		}
		if len(o.IDs) > 0 {
			if res.Skipped, err = skipped(ctx, tx, o.IDs, moved, o.Limit); err != nil {
				return err
			}
		}
		if err := notify(ctx, tx, moved); err != nil {
			return err
		}
		if o.Then != nil {
			return o.Then(ctx, tx, res)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ops: replay dead letters: %w", err)
	}
	return res, nil
}

// skipped explains each requested id that was not replayed.
func skipped(ctx context.Context, tx pgx.Tx, ids []int64, moved []store.Moved, limit int) ([]Skipped, error) {
	done := make(map[int64]bool, len(moved))
	for _, m := range moved {
		done[m.ID] = true
	}
	states, err := store.States(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	out := []Skipped{}
	seen := map[int64]bool{}
	for _, id := range slices.Sorted(slices.Values(ids)) {
		if done[id] || seen[id] {
			continue
		}
		seen[id] = true
		st, ok := states[id]
		switch {
		case !ok:
			out = append(out, Skipped{ID: id, State: "missing", Reason: "no such effect"})
		case st == "reconciliation_required":
			out = append(out, Skipped{ID: id, State: st,
				Reason: "reconciliation records are never replayed; an operator must resolve them (pgoutbox reconcile)"})
		case st == "dead_letter":
			out = append(out, Skipped{ID: id, State: st,
				Reason: fmt.Sprintf("over the batch limit of %d, or locked by a concurrent replay", limit)})
		default:
			out = append(out, Skipped{ID: id, State: st, Reason: "not a dead letter"})
		}
	}
	return out, nil
}
