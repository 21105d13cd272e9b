package store

// The statements of an operator's pause, resume and cancel (internal/ops,
// docs/console.md): the pauses table of migration 00023, which the claim
// reads (notPausedSQL), and the cancel of effects that should never run.

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// notPausedSQL is true when the claimed queue ($1) is not paused: one
// probe of pgoutbox.queue_pauses' primary key per claim statement (it does
// not depend on the row, so PostgreSQL evaluates it once, as an InitPlan).
const notPausedSQL = `NOT EXISTS (SELECT 1 FROM pgoutbox.queue_pauses qp WHERE qp.queue = $1)`

// Pause is one paused queue.
type Pause struct {
	Queue    string
	By       string
	At       time.Time
	Reason   string
	Existing bool // PauseQueue: the queue was already paused (nothing changed)
}

const pauseSQL = `
WITH ins AS (
    INSERT INTO pgoutbox.queue_pauses (queue, paused_by, reason) VALUES ($1, $2, $3)
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue, paused_by, paused_at, reason, false)
SELECT * FROM ins
UNION ALL
SELECT queue, paused_by, paused_at, reason, true FROM pgoutbox.queue_pauses
WHERE queue = $1 AND NOT EXISTS (SELECT 1 FROM ins)`

// PauseQueue pauses queue, recording by and reason. Pausing a paused
// queue changes nothing and returns the existing pause (Existing set).
func PauseQueue(ctx context.Context, db DBTX, queue, by, reason string) (Pause, error) {
	var p Pause
	err := db.QueryRow(ctx, pauseSQL, queue, by, reason).Scan(&p.Queue, &p.By, &p.At, &p.Reason, &p.Existing)
	return p, MapError(err)
}

const resumeSQL = `DELETE FROM pgoutbox.queue_pauses WHERE queue = $1
RETURNING queue, paused_by, paused_at, reason, true`

// ResumeQueue deletes queue's pause and wakes its workers (a NOTIFY
// delivered at commit). found=false: the queue was not paused.
func ResumeQueue(ctx context.Context, db DBTX, queue string) (p Pause, found bool, err error) {
	err = db.QueryRow(ctx, resumeSQL, queue).Scan(&p.Queue, &p.By, &p.At, &p.Reason, &p.Existing)
	if err == pgx.ErrNoRows {
		return Pause{}, false, nil
	}
	if err != nil {
		return Pause{}, false, MapError(err)
	}
	return p, true, NotifyQueues(ctx, db, []string{queue})
}

// Pauses returns every paused queue, by name.
func Pauses(ctx context.Context, db DBTX) ([]Pause, error) {
	rows, err := db.Query(ctx, `SELECT queue, paused_by, paused_at, reason FROM pgoutbox.queue_pauses ORDER BY queue`)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pause, error) {
		var p Pause
		err := r.Scan(&p.Queue, &p.By, &p.At, &p.Reason)
		return p, err
	})
	return out, MapError(err)
}

// CancelledFrom is one effect a cancel moved, and the state it left.
type CancelledFrom struct {
	ID    int64
	Queue string
	Type  string
	From  string
}

// cancelSQL completes the requested effects that may be cancelled, with
// the cancellation as their resolution: available (due, scheduled,
// retrying or parked) and dead_letter rows whose delivery never started.
// Never a leased row (in delivery), a reconciliation record, or an effect
// whose delivery_started_at is set (its request may have been sent:
// reconciliation's job). Rows another transaction holds (a row-lock
// claim delivering it right now, a replay) are skipped, never waited for.
// A parked row gets its due time back. As completed, a cancelled head
// releases its ordering key (the unpark trigger runs). $1 ids, $2 the
// resolution's "by", $3 its "reason".
const cancelSQL = `
WITH target AS (
    SELECT id, state::text AS from_state FROM pgoutbox.effects
    WHERE id = ANY($1::bigint[]) AND state IN ('available', 'dead_letter') AND delivery_started_at IS NULL
    ORDER BY id
    FOR UPDATE SKIP LOCKED)
UPDATE pgoutbox.effects e
SET state = 'completed', completed_at = now(),
    available_at = coalesce(e.parked_due_at, e.available_at), parked_due_at = NULL,
    resolution = jsonb_build_object('cancelled', true, 'by', $2::text, 'reason', $3::text,
        'from_state', t.from_state, 'at', now())
FROM target t
WHERE e.id = t.id
RETURNING e.id, e.queue, e.effect_type, t.from_state`

// CancelEffects cancels the effects among ids that may be cancelled (see
// cancelSQL) and returns them; the others are left as they are.
func CancelEffects(ctx context.Context, db DBTX, ids []int64, by, reason string) ([]CancelledFrom, error) {
	rows, err := db.Query(ctx, cancelSQL, ids, by, reason)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CancelledFrom, error) {
		var c CancelledFrom
		err := r.Scan(&c.ID, &c.Queue, &c.Type, &c.From)
		return c, err
	})
	return out, MapError(err)
}

// CancelCandidate is what a cancel's confirmation and refusal show of one
// requested effect.
type CancelCandidate struct {
	ID               int64
	Queue            string
	Type             string
	State            string
	DeliveryStarted  bool
	AvailableAt      time.Time
	Attempts         int
	OrderingKey      string
	AlreadyCancelled bool
}

const cancelCandidatesSQL = `
SELECT e.id, e.queue, e.effect_type, e.state::text, e.delivery_started_at IS NOT NULL,
    coalesce(e.parked_due_at, e.available_at), e.attempts, coalesce(e.ordering_key, ''),
    coalesce((e.resolution->>'cancelled')::boolean, false)
FROM pgoutbox.effects e WHERE e.id = ANY($1::bigint[]) ORDER BY e.id`

// CancelCandidates reads the requested effects as they are now (a missing
// id is absent).
func CancelCandidates(ctx context.Context, db DBTX, ids []int64) ([]CancelCandidate, error) {
	rows, err := db.Query(ctx, cancelCandidatesSQL, ids)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (CancelCandidate, error) {
		var c CancelCandidate
		err := r.Scan(&c.ID, &c.Queue, &c.Type, &c.State, &c.DeliveryStarted, &c.AvailableAt, &c.Attempts,
			&c.OrderingKey, &c.AlreadyCancelled)
		return c, err
	})
	return out, MapError(err)
}
