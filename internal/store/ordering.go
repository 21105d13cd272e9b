package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// setOrderingChoicesSQL records each (queue, type)'s dead-letter choice for
// ordered keys (migration 00018), writing only the rows that change, and
// returns the recorded choices it changed with the time the former one was
// recorded. The rows are written in (queue, type) order, so two
// registrations at once cannot deadlock. $1 queues, $2 types, $3 choices of
// the types: every queue gets every type.
const setOrderingChoicesSQL = `
WITH want AS (
    SELECT q.queue, t.effect_type, t.moves_on
    FROM unnest($1::text[]) AS q(queue)
    CROSS JOIN unnest($2::text[], $3::bool[]) AS t(effect_type, moves_on)
), former AS (
    SELECT o.queue, o.effect_type, o.updated_at
    FROM pgoutbox.ordering_choices o
    JOIN want w ON w.queue = o.queue AND w.effect_type = o.effect_type
), written AS (
    INSERT INTO pgoutbox.ordering_choices AS o (queue, effect_type, dead_letter_moves_on)
    SELECT w.queue, w.effect_type, w.moves_on FROM want w
    ORDER BY w.queue COLLATE "C", w.effect_type COLLATE "C"
    ON CONFLICT (queue, effect_type) DO UPDATE
    SET dead_letter_moves_on = excluded.dead_letter_moves_on, updated_at = now()
    WHERE o.dead_letter_moves_on IS DISTINCT FROM excluded.dead_letter_moves_on
    RETURNING o.queue, o.effect_type, o.dead_letter_moves_on
)
SELECT w.queue, w.effect_type, w.dead_letter_moves_on, f.updated_at
FROM written w
JOIN former f ON f.queue = w.queue AND f.effect_type = w.effect_type
ORDER BY w.queue, w.effect_type`

// OrderingChange is a recorded ordering choice that a registration changed.
type OrderingChange struct {
	Queue, Type string
	// MovesOn is the new choice (the former one was its opposite).
	MovesOn bool
	// FormerSince is when the former choice was recorded.
	FormerSince time.Time
}

// SetOrderingChoices records, for each queue of queues and each effect
// type in names, whether the type's dead letters let their ordering key
// move on in that queue (moveOn[i]) or block it (false). It returns the
// recorded choices it changed; a (queue, type) recorded for the first time
// is no change.
func SetOrderingChoices(ctx context.Context, db DBTX, queues, names []string, moveOn []bool) ([]OrderingChange, error) {
	rows, err := db.Query(ctx, setOrderingChoicesSQL, queues, names, moveOn)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OrderingChange, error) {
		var c OrderingChange
		err := r.Scan(&c.Queue, &c.Type, &c.MovesOn, &c.FormerSince)
		return c, err
	})
	return out, MapError(err)
}

// BlockedKey is an ordering key whose next effect waits: Head is the
// earliest effect of the key that holds the others back.
type BlockedKey struct {
	Queue       string
	OrderingKey string
	// Head is the blocking effect; its State says why: leased (in
	// delivery), available (retrying, scheduled, or about to be claimed),
	// reconciliation_required (an operator must resolve it) or dead_letter
	// (strict: replay it).
	HeadID        int64
	HeadType      string
	HeadState     string
	HeadAttempts  int
	HeadLastError *string
	// HeadAvailableAt is when an available head falls due.
	HeadAvailableAt time.Time
	// Waiting counts the later effects of the key that are not completed.
	Waiting int64
	// OldestWaiting is the creation time of the oldest waiting effect.
	OldestWaiting time.Time
}

// Stuck reports whether only an operator can unblock the key: its head is a
// (strict) dead letter or a reconciliation record, the heads BlockedKeys'
// stuckOnly keeps.
func (b BlockedKey) Stuck() bool {
	return b.HeadState == "dead_letter" || b.HeadState == "reconciliation_required"
}

// blockedKeysSQL lists the ordering keys with waiting effects and the
// effect that heads each: for every (queue, key) among the ordered effects
// that are not completed (effects_ordering_idx), the earliest that blocks
// (blocksSQL), and the count of the later ones. $1 queue (” for all), $2
// only keys stuck behind an operator's decision (dead_letter or
// reconciliation_required), $3 limit.
const blockedKeysSQL = `
WITH heads AS (
    SELECT DISTINCT ON (p.queue, p.ordering_key)
        p.queue, p.ordering_key, p.id, p.effect_type, p.state::text AS state, p.attempts, p.last_error,
        coalesce(p.parked_due_at, p.available_at) AS available_at
    FROM pgoutbox.effects p
    WHERE p.ordering_key IS NOT NULL AND p.state <> 'completed' AND ($1 = '' OR p.queue = $1)
      AND ` + blocksSQL + `
    ORDER BY p.queue, p.ordering_key, p.id
)
SELECT h.queue, h.ordering_key, h.id, h.effect_type, h.state, h.attempts, h.last_error, h.available_at,
    w.n, w.oldest
FROM heads h
CROSS JOIN LATERAL (
    SELECT count(*) AS n, min(x.created_at) AS oldest
    FROM pgoutbox.effects x
    WHERE x.queue = h.queue AND x.ordering_key = h.ordering_key AND x.id > h.id
      AND x.ordering_key IS NOT NULL AND x.state <> 'completed'
) w
WHERE w.n > 0 AND (NOT $2 OR h.state IN ('dead_letter', 'reconciliation_required'))
ORDER BY w.oldest, h.queue, h.ordering_key
LIMIT $3`

// BlockedKeys lists up to limit ordering keys (of queue, or of every queue
// when queue is empty) that have effects waiting behind an earlier one,
// longest waiting first, with the effect at their head. stuckOnly keeps the
// keys whose head waits for an operator (dead_letter,
// reconciliation_required).
func BlockedKeys(ctx context.Context, db DBTX, queue string, stuckOnly bool, limit int) ([]BlockedKey, error) {
	rows, err := db.Query(ctx, blockedKeysSQL, queue, stuckOnly, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BlockedKey, error) {
		var b BlockedKey
		err := r.Scan(&b.Queue, &b.OrderingKey, &b.HeadID, &b.HeadType, &b.HeadState, &b.HeadAttempts,
			&b.HeadLastError, &b.HeadAvailableAt, &b.Waiting, &b.OldestWaiting)
		return b, err
	})
	return out, MapError(err)
}

// parkSQL parks (migration 00014) up to $2 available, unparked ordered
// effects of queue $1 (empty: every queue) that have a blocking predecessor
// and either a stuck one (stuckSQL: a strict dead letter or a
// reconciliation record, which only an operator clears) or at least $3
// (>= 1) earlier effects of their key not completed: their due time moves
// to parked_due_at and available_at becomes 'infinity', out of the claim's
// range. The limit counts only effects that pass those tests, so a batch of
// ordered effects that are not blocked cannot crowd out the blocked ones.
// For each it holds a share lock on one blocking predecessor until it
// commits, taken SKIP LOCKED: the parker never waits, and a predecessor
// another transaction is changing (completing, failing) is not used. That
// lock is what makes a park safe: a transaction that later changes the
// predecessor waits for the parker to commit, so its un-park trigger
// (effects_unpark_next) sees the parked row. Under READ COMMITTED a
// predecessor changed after this statement's snapshot is re-read when
// locked and dropped if it no longer blocks.
const parkSQL = `
WITH ranked AS (
    -- One pass over the ordered effects that are not completed
    -- (effects_ordering_idx order): each row's position in its key, and
    -- whether an earlier row of the key blocks it, or is stuck.
    SELECT r.id FROM (
        SELECT b.id, b.state, b.parked_due_at,
            row_number() OVER w - 1 AS earlier,
            coalesce(bool_or(b.blocks) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS blocked,
            coalesce(bool_or(b.stuck) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), false) AS stuck
        FROM (
            SELECT p.id, p.queue, p.ordering_key, p.state, p.parked_due_at,
                ` + blocksSQL + ` AS blocks, ` + stuckSQL + ` AS stuck
            FROM pgoutbox.effects p
            WHERE p.ordering_key IS NOT NULL AND p.state <> 'completed' AND ($1 = '' OR p.queue = $1)
        ) b
        WINDOW w AS (PARTITION BY b.queue, b.ordering_key ORDER BY b.id)
    ) r
    WHERE r.state = 'available' AND r.parked_due_at IS NULL AND r.blocked AND (r.stuck OR r.earlier >= $3)
    LIMIT $2
), cand AS (
    SELECT e.id, e.queue, e.ordering_key FROM pgoutbox.effects e
    WHERE e.id IN (SELECT id FROM ranked)
      AND e.ordering_key IS NOT NULL AND e.state = 'available' AND e.parked_due_at IS NULL
      AND NOT ` + headOfLineSQL + `
    FOR UPDATE OF e SKIP LOCKED
), blocked AS (
    SELECT e.id FROM cand e
    WHERE EXISTS (
        SELECT 1 FROM (
            SELECT p.id FROM pgoutbox.effects p
            WHERE ` + blockingEarlierSQL + `
            ORDER BY p.id
            LIMIT 1
            FOR SHARE SKIP LOCKED) b)
)
UPDATE pgoutbox.effects e
SET parked_due_at = e.available_at, available_at = 'infinity'
FROM blocked x
WHERE e.id = x.id AND e.state = 'available' AND e.parked_due_at IS NULL
RETURNING e.id`

// ParkBehindDefault is the Park threshold the sweeper uses for a key whose
// head is in delivery or retrying: an effect of it is parked only behind at
// least 32 earlier effects of its key that are not completed. Such a short
// backlog drains soon and costs the claim a few probes, and parking it
// would cost two updates per effect (park, un-park); the claim walks at
// most this many waiting effects of such a key before the parked rest. The
// followers of a stuck head (stuckSQL) are parked whatever their number:
// they may wait for days, and thousands of such keys would otherwise cost
// every claim of their queue up to 31 probes each.
const ParkBehindDefault = 32

// Park parks up to limit ordered effects of queue ("" for every queue) that
// wait behind a blocking predecessor of their key and either behind a stuck
// one (a strict dead letter or a reconciliation record) or behind at least
// behind (>= 1) earlier effects of the key that are not completed, so the
// claim scan no longer reaches them (migration 00014), and returns how many
// it parked. They are un-parked when they become the first blocking effect
// of their key (the effects_unpark_next trigger, when the effect before them
// is completed or dead-lettered) or, as a safety net, by Unpark.
func Park(ctx context.Context, db DBTX, queue string, behind, limit int) (int64, error) {
	if behind < 1 {
		return 0, fmt.Errorf("store: park: behind must be at least 1, not %d", behind)
	}
	tag, err := db.Exec(ctx, parkSQL, queue, limit, behind)
	if err != nil {
		return 0, MapError(err)
	}
	return tag.RowsAffected(), nil
}

// unparkSQL un-parks up to $1 parked effects that no predecessor blocks
// (or that are no longer available): the safety net behind the
// effects_unpark_next trigger, so a missed un-park costs at most one sweep
// interval. Un-parking is always safe: the claim's head-of-line check still
// holds back an effect whose key is blocked.
const unparkSQL = `
WITH stale AS (
    SELECT e.id FROM pgoutbox.effects e
    WHERE e.parked_due_at IS NOT NULL
      AND (e.state <> 'available' OR ` + headOfLineSQL + `)
    ORDER BY e.queue, e.ordering_key, e.id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE pgoutbox.effects e
SET available_at = e.parked_due_at, parked_due_at = NULL
FROM stale s
WHERE e.id = s.id AND e.parked_due_at IS NOT NULL
RETURNING e.queue`

// Unpark un-parks up to limit parked effects whose key no longer blocks
// them and returns their queues (one entry per effect).
func Unpark(ctx context.Context, db DBTX, limit int) ([]string, error) {
	rows, err := db.Query(ctx, unparkSQL, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return out, MapError(err)
}
