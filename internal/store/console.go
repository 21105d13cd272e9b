package store

// The operator console's statements (internal/console, docs/console.md):
// the effects list with its filters and keyset paging, one effect's detail,
// the dead-letter count a replay confirms, and the console's audit table
// (migration 00010). Every filter is a bind parameter.

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// EffectFilter narrows the console's effects list. Empty fields match
// everything; values are bind parameters compared literally.
type EffectFilter struct {
	Queue string
	// State is an effect_state name; anything else matches nothing.
	State string
	Type  string
	// KeyPrefix matches idempotency keys that start with it.
	KeyPrefix string
	// ErrorText matches a last_error that contains it, case-insensitively.
	ErrorText string
	// OrderingKey matches the effects of this ordering key (migration
	// 00013) exactly.
	OrderingKey string
}

// EffectRow is one line of the effects list: no payload, only its subject.
type EffectRow struct {
	ID          int64
	Queue       string
	Type        string
	Key         string
	State       string
	Attempts    int
	MaxAttempts int
	CreatedAt   time.Time
	LastError   string
	// Subject is the SubjectSQL object of the payload.
	Subject []byte
	// DueAt is when an available effect is due: its parked due time when
	// parked (migration 00014), never 'infinity'.
	DueAt time.Time
	// OrderingKey is "" when the effect has none.
	OrderingKey string
	// Waiting: an available ordered effect that an earlier effect of its
	// key holds back (parked or not), or, in a queue switched back from
	// batch storage, its stream's unsettled effects (migration 00034).
	Waiting bool
	// Cancelled: completed by an operator's cancel (its resolution says
	// so), never delivered.
	Cancelled bool
}

// effectsCols are the columns of an EffectRow.
const effectsCols = `id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, created_at,
    coalesce(last_error, ''), ` + SubjectSQL + `, coalesce(parked_due_at, available_at), coalesce(ordering_key, ''),
    (e.state = 'available' AND e.ordering_key IS NOT NULL AND (EXISTS (
        SELECT 1 FROM pgoutbox.effects p WHERE ` + blockingEarlierSQL + `) OR ` + behindStreamSQL + `)),
    coalesce((resolution->>'cancelled')::boolean, false)`

// effectsFilter is the WHERE clause shared by both list statements:
// $1 queue, $2 state, $3 type, $4 key prefix, $5 error text, $6 the id the
// page starts below (always set, so the primary key's range is sargable),
// $8 ordering key ($7 is the page size).
const effectsFilter = `($1::text = '' OR queue = $1) AND ($2::text = '' OR state::text = $2)
  AND ($3::text = '' OR effect_type = $3) AND ($4::text = '' OR starts_with(idempotency_key, $4))
  AND ($5::text = '' OR strpos(lower(coalesce(last_error, '')), lower($5)) > 0)
  AND ($8::text = '' OR ordering_key = $8)
  AND id < $6::bigint`

// effectsListSQL pages every row of pgoutbox.effects newest first: a
// backward walk of the primary key that stops after $7 matching rows, so a
// page costs the rows skipped by the filters, never a sort of the table.
const effectsListSQL = `
SELECT ` + effectsCols + `
FROM pgoutbox.effects e
WHERE ` + effectsFilter + `
ORDER BY id DESC
LIMIT $7`

// attentionListSQL is effectsListSQL for the states operators act on
// (dead_letter, reconciliation_required): the literal state list implies
// the predicate of effects_attention_idx (queue, state, id), so even a
// generic plan reads only those rows, whatever the table's history holds.
//
// All the lists are planned per call (custom plans): with the filters'
// values known, an empty filter folds away. A generic plan misjudges the
// optional filters (it estimates one row) and would scan and sort the
// table, so callers must not force one (plan_cache_mode stays auto: the
// generic plan's cost is far above the custom ones, so PostgreSQL keeps
// planning).
const attentionListSQL = `
SELECT ` + effectsCols + `
FROM pgoutbox.effects e
WHERE state IN ('dead_letter', 'reconciliation_required') AND ` + effectsFilter + `
ORDER BY id DESC
LIMIT $7`

// orderedListSQL is effectsListSQL for an ordering key and a state other
// than completed: the literal predicates imply those of effects_ordering_idx
// (queue, ordering_key, id), so the page reads only the key's effects that
// are not completed. (An ordering key with no state, or with completed,
// walks the primary key like the filters without an index.)
const orderedListSQL = `
SELECT ` + effectsCols + `
FROM pgoutbox.effects e
WHERE ordering_key IS NOT NULL AND state <> 'completed' AND ` + effectsFilter + `
ORDER BY id DESC
LIMIT $7`

// A batch queue's effects that never left pgoutbox.stream (migration
// 00027) are listed from their own indexed read, not by filtering
// pgoutbox.effect_states: the planner cannot walk the view's stream part in
// id order (each row's state is a lateral read of its batch), so a page
// through the view read and sorted every stream row the filters left
// (235 ms for 7,000 of 21,000; docs/batch-storage.md). The statements
// below choose the page's stream ids on the stream's own indexes, then
// read those ids' columns and state through pgoutbox.effect_states, so the
// states shown are the view's.

// streamIDsFilter keeps the stream rows that match the filters ($1 queue,
// $3 type, $4 key prefix, $8 ordering key, below $6) and were not moved to
// pgoutbox.effects (the view shows those as rows). Filters no stream
// effect can match are said on the parameters alone, so the planner drops
// the stream's part instead of walking it: an error text (a stream effect
// has none; a failure moves it to pgoutbox.effects), a state other than
// available, leased and completed. (A queue with no row in the stream is
// found empty through stream_xid_idx, TestConsoleListsWalkTheStreamByIndex.)
const streamIDsFilter = `$5::text = '' AND $2::text IN ('', 'available', 'leased', 'completed')
      AND ($1::text = '' OR s.queue = $1) AND ($3::text = '' OR s.effect_type = $3)
      AND ($4::text = '' OR starts_with(s.idempotency_key, $4)) AND ($8::text = '' OR s.ordering_key = $8)
      AND s.id < $6::bigint
      AND NOT EXISTS (SELECT 1 FROM pgoutbox.effects m WHERE m.id = s.id)`

// streamPendingIDs are the ids of the stream effects still to deliver
// below $6 (of queue $1 when set): pgoutbox.stream_pending, the rows
// committed after each batch queue's newest settled batch (a range of
// stream_xid_idx per queue), as many as the queues' backlog.
const streamPendingIDs = `SELECT p.id FROM pgoutbox.stream_pending p
    WHERE ($1::text = '' OR p.queue = $1) AND p.id < $6::bigint`

// streamAnyIDs, with no state filter: a backward walk of stream_id_idx
// that stops after $7 matching rows, as effectsListSQL walks the primary
// key.
const streamAnyIDs = `SELECT s.id FROM pgoutbox.stream s
    WHERE ` + streamIDsFilter + `
    ORDER BY s.id DESC LIMIT $7`

// streamToDeliverIDs, for available or leased: the effects still to
// deliver in that state, by id (a probe of stream_id_idx each), never the
// settled ones a walk would skip.
const streamToDeliverIDs = `SELECT s.id FROM pgoutbox.stream s
    WHERE s.id = ANY (ARRAY(` + streamPendingIDs + ` AND p.state::text = $2))
      AND ` + streamIDsFilter + `
    ORDER BY s.id DESC LIMIT $7`

// streamSettledIDs, for completed: the walk of streamAnyIDs, keeping the
// effects settled: committed in the snapshot of the newest settled batch
// of their queue that holds their slot (a batch is leased only once every
// older one its slots overlap settled, so every batch that holds them is
// settled), or passed by the settled position of an open batch that holds
// them (pgoutbox.effect_states' rule, for the queue's few open batches:
// stream_batches_open_idx). Per row two index probes, no read of
// the batch's other effects. Like the rows' walk of the primary key, it
// passes over the effects still to deliver, the newest, before it finds
// completed ones.
const streamSettledIDs = `SELECT s.id FROM pgoutbox.stream s
    WHERE ` + streamIDsFilter + `
      AND (coalesce(pg_visible_in_snapshot(s.xid, (SELECT d.snap FROM pgoutbox.stream_batches d
               WHERE d.queue = s.queue AND d.done_at IS NOT NULL AND s.slot BETWEEN d.slot_lo AND d.slot_hi
               ORDER BY d.id DESC LIMIT 1)), false)
           OR EXISTS (SELECT 1 FROM pgoutbox.stream_batches o
               WHERE o.queue = s.queue AND o.done_at IS NULL AND o.done_through >= s.id AND o.min_id <= s.id
                 AND s.slot BETWEEN o.slot_lo AND o.slot_hi
                 AND pg_visible_in_snapshot(s.xid, o.snap)
                 AND (o.prev_snap IS NULL OR NOT pg_visible_in_snapshot(s.xid, o.prev_snap))))
    ORDER BY s.id DESC LIMIT $7`

// streamCols are effectsCols for a stream effect of pgoutbox.effect_states:
// no last error, no parking, never cancelled (a cancel acts on
// pgoutbox.effects); waiting when an earlier effect of its key in
// pgoutbox.effects blocks it (a retry, a strict dead letter: its batch
// moves it there, behind that one).
const streamCols = `id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, created_at,
    '', ` + SubjectSQL + `, available_at, coalesce(ordering_key, ''),
    (e.state = 'available' AND e.ordering_key IS NOT NULL AND EXISTS (
        SELECT 1 FROM pgoutbox.effects p WHERE ` + blockingEarlierSQL + `)),
    false`

// withStream is a list of rows (effectsListSQL, orderedListSQL) merged
// with the stream effects whose ids streamIDs picks: at most $7 of each,
// the newest $7 of both. Each stream effect is read through
// pgoutbox.effect_states by id (a probe of stream_id_idx), with the
// view's state, which must match the state filter.
func withStream(rowsSQL, streamIDs string) string {
	return `
SELECT * FROM (
    (` + rowsSQL + `)
    UNION ALL
    (SELECT ` + streamCols + `
     FROM pgoutbox.effect_states e
     WHERE e.storage = 'batch' AND e.id = ANY (ARRAY(` + streamIDs + `))
       AND ($2::text = '' OR e.state::text = $2)
     ORDER BY id DESC)
) u
ORDER BY id DESC
LIMIT $7`
}

// The lists of both storages, by their filters (listSQL).
var (
	effectsAnySQL       = withStream(effectsListSQL, streamAnyIDs)
	effectsToDeliverSQL = withStream(effectsListSQL, streamToDeliverIDs)
	effectsSettledSQL   = withStream(effectsListSQL, streamSettledIDs)
	orderedToDeliverSQL = withStream(orderedListSQL, streamToDeliverIDs)
)

// listSQL is the statement of the effects list for f: the index each
// storage's part reads depends on the filters.
func listSQL(f EffectFilter) string {
	switch {
	case f.State == "dead_letter" || f.State == "reconciliation_required":
		return attentionListSQL // the stream holds none: a batch moves them to pgoutbox.effects
	case f.OrderingKey != "" && f.State != "" && f.State != "completed":
		return orderedToDeliverSQL
	case f.State == "available" || f.State == "leased":
		return effectsToDeliverSQL
	case f.State == "completed":
		return effectsSettledSQL
	}
	return effectsAnySQL // also an unknown state: its parts match nothing
}

// noJIT says whether a list statement must run with jit off: those that
// read pgoutbox.stream_pending, or test each walked stream row against its
// queue's batches. Their estimates are far off (a queue_storage too small
// for autovacuum to analyze counts as 810 queues, each queue's effects to
// deliver as a third of its stream, a state filter as matching almost
// nothing), so their cost passes jit_above_cost, and compiling one took 3 to 6 s for a
// page that then ran in milliseconds (TestConsoleListsWalkTheStreamByIndex).
func noJIT(sql string) bool {
	return sql == effectsToDeliverSQL || sql == effectsSettledSQL || sql == orderedToDeliverSQL
}

// ListEffects returns up to limit effects matching f with id < beforeID
// (0: the newest), newest first, from either storage: the rows of
// pgoutbox.effects and the effects of batch queues still in the stream,
// with their pgoutbox.effect_states state. A state filter of available,
// leased or completed runs in a transaction of its own (a savepoint when db
// is a transaction, whose jit is then off until it ends) with jit off.
func ListEffects(ctx context.Context, db DBTX, f EffectFilter, beforeID int64, limit int) ([]EffectRow, error) {
	if beforeID <= 0 {
		beforeID = math.MaxInt64
	}
	sql := listSQL(f)
	args := []any{f.Queue, f.State, f.Type, f.KeyPrefix, f.ErrorText, beforeID, limit, f.OrderingKey}
	if !noJIT(sql) {
		return collectEffectRows(db.Query(ctx, sql, args...))
	}
	var out []EffectRow
	err := withoutJIT(ctx, db, func(q DBTX) error {
		var err error
		out, err = collectEffectRows(q.Query(ctx, sql, args...))
		return err
	})
	return out, MapError(err)
}

// withoutJIT runs fn with jit off: in a transaction of its own, or a
// savepoint when db is a transaction (whose jit is then off until it
// ends). The statements that read pgoutbox.stream_pending, or test stream
// rows against their batches, are estimated far above what they cost, past
// jit_above_cost: compiling them took seconds for a query of milliseconds.
func withoutJIT(ctx context.Context, db DBTX, fn func(DBTX) error) error {
	b, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return fn(db)
	}
	return pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL jit = off`); err != nil {
			return err
		}
		return fn(tx)
	})
}

const effectsByIDSQL = `
SELECT ` + effectsCols + `
FROM pgoutbox.effects e
WHERE id = ANY($1::bigint[])
ORDER BY id`

// EffectsByID returns the effects among ids that exist in pgoutbox.effects,
// by id (the console's replay and cancel confirmations list those that will
// move; both act on pgoutbox.effects only).
func EffectsByID(ctx context.Context, db DBTX, ids []int64) ([]EffectRow, error) {
	return collectEffectRows(db.Query(ctx, effectsByIDSQL, ids))
}

func collectEffectRows(rows pgx.Rows, err error) ([]EffectRow, error) {
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EffectRow, error) {
		var e EffectRow
		err := r.Scan(&e.ID, &e.Queue, &e.Type, &e.Key, &e.State, &e.Attempts, &e.MaxAttempts, &e.CreatedAt,
			&e.LastError, &e.Subject, &e.DueAt, &e.OrderingKey, &e.Waiting, &e.Cancelled)
		return e, err
	})
	return out, MapError(err)
}

// EffectDetail is every column of an effect an operator may see: all but
// the lease token.
type EffectDetail struct {
	Record
	// AvailableAt is when the effect is (or was) due; for a parked effect
	// (migration 00014) the due time it keeps while parked, not 'infinity'.
	AvailableAt      time.Time
	LeasedAt         *time.Time
	LeaseOwner       *string
	LeaseExpiresAt   *time.Time
	CompletedAt      *time.Time
	DeadLetteredAt   *time.Time
	ReconciliationAt *time.Time
	// OrderingKey is the effect's ordering key (migration 00013), nil when
	// it has none.
	OrderingKey *string
	// Resolution is the operator's recorded resolution of a reconciliation
	// record (JSON), nil when none.
	Resolution []byte
	// Storage is where the effect is: StorageRows (a row of
	// pgoutbox.effects, which holds every effect of a rows queue and a
	// batch queue's exceptions) or StorageBatch (a batch queue's effect
	// still in pgoutbox.stream, with what effect_states shows of it).
	Storage string
}

const effectDetailSQL = `
SELECT id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, payload,
    created_at, delivery_started_at, last_error, coalesce(parked_due_at, available_at), leased_at, lease_owner, lease_expires_at,
    completed_at, dead_lettered_at, reconciliation_at, resolution, ordering_key, 'rows'
FROM pgoutbox.effects WHERE id = $1`

// effectDetailStreamSQL is effectDetailSQL for an effect of batch storage
// still in the stream (migration 00027), through pgoutbox.effect_states:
// what a stream row records, and its state.
const effectDetailStreamSQL = `
SELECT id, queue, effect_type, idempotency_key, state::text, attempts, max_attempts, payload,
    created_at, delivery_started_at, last_error, available_at, NULL::timestamptz, NULL::text, lease_expires_at,
    completed_at, NULL::timestamptz, NULL::timestamptz, NULL::jsonb, ordering_key, storage
FROM pgoutbox.effect_states WHERE id = $1 AND storage = 'batch'`

// GetEffectDetail loads one effect for the console, from either storage;
// found=false when it does not exist.
func GetEffectDetail(ctx context.Context, db DBTX, id int64) (EffectDetail, bool, error) {
	d, found, err := getEffectDetail(ctx, db, effectDetailSQL, id)
	if err != nil || found {
		return d, found, err
	}
	return getEffectDetail(ctx, db, effectDetailStreamSQL, id)
}

func getEffectDetail(ctx context.Context, db DBTX, sql string, id int64) (EffectDetail, bool, error) {
	var d EffectDetail
	err := db.QueryRow(ctx, sql, id).Scan(&d.ID, &d.Queue, &d.Type, &d.Key, &d.State, &d.Attempts,
		&d.MaxAttempts, &d.Payload, &d.CreatedAt, &d.DeliveryStartedAt, &d.LastError, &d.AvailableAt, &d.LeasedAt,
		&d.LeaseOwner, &d.LeaseExpiresAt, &d.CompletedAt, &d.DeadLetteredAt, &d.ReconciliationAt, &d.Resolution,
		&d.OrderingKey, &d.Storage)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, false, nil
	}
	return d, err == nil, MapError(err)
}

const countDeadLettersSQL = `
SELECT count(*) FROM pgoutbox.effects
WHERE state = 'dead_letter' AND ($1::text = '' OR queue = $1) AND ($2::text = '' OR effect_type = $2)`

// CountDeadLetters counts the dead letters f selects (the number a replay
// of a whole queue asks the operator to confirm).
func CountDeadLetters(ctx context.Context, db DBTX, f OpsFilter) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, countDeadLettersSQL, f.Queue, f.Type).Scan(&n)
	return n, MapError(err)
}

// AuditEntry is one row of pgoutbox.console_audit.
type AuditEntry struct {
	ID int64
	// At is stamped by the database on insert.
	At       time.Time
	Operator string
	// Session is a digest of the session, never the session id.
	Session string
	Action  string
	Target  string
	// Changed is how many effects the action changed.
	Changed int
	Outcome string
}

const insertAuditSQL = `
INSERT INTO pgoutbox.console_audit (operator, session, action, target, changed, outcome)
VALUES ($1, $2, $3, $4, $5, $6)`

// InsertAudit records one console action (run it in the action's
// transaction when there is one).
func InsertAudit(ctx context.Context, db DBTX, e AuditEntry) error {
	_, err := db.Exec(ctx, insertAuditSQL, e.Operator, e.Session, e.Action, e.Target, e.Changed, e.Outcome)
	return MapError(err)
}

const listAuditSQL = `
SELECT id, at, operator, session, action, target, changed, outcome
FROM pgoutbox.console_audit ORDER BY id DESC LIMIT $1`

// ListAudit returns the newest limit audit rows, newest first.
func ListAudit(ctx context.Context, db DBTX, limit int) ([]AuditEntry, error) {
	return queryAudit(ctx, db, listAuditSQL, limit)
}

// queryAudit runs a statement that selects console_audit's columns in
// their table order and collects its rows.
func queryAudit(ctx context.Context, db DBTX, sql string, args ...any) ([]AuditEntry, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := r.Scan(&e.ID, &e.At, &e.Operator, &e.Session, &e.Action, &e.Target, &e.Changed, &e.Outcome)
		return e, err
	})
	return out, MapError(err)
}

// Attempt is one row of pgoutbox.effect_attempts (migration 00012): a
// failed attempt of an effect, or a replay of it.
type Attempt struct {
	// Attempt is the effect's attempt count when the attempt ended; for a
	// replay, the attempts the dead letter had.
	Attempt int
	// At is the database clock of the statement that ended the attempt.
	At time.Time
	// Outcome is where the effect went: "retrying", "dead_letter",
	// "reconciliation_required" or "replayed".
	Outcome string
	// Error is the attempt's error (last_error as it was set), "" for a
	// replay.
	Error string
	// Worker is the lease owner whose attempt ended, "" when none.
	Worker string
}

const listAttemptsSQL = `
SELECT attempt, at, outcome, coalesce(error, ''), coalesce(worker, '') FROM (
    SELECT seq, attempt, at, outcome, error, worker
    FROM pgoutbox.effect_attempts WHERE effect_id = $1 ORDER BY seq DESC LIMIT $2
) a ORDER BY seq`

// ListAttempts returns the newest limit recorded attempts of one effect,
// oldest first.
func ListAttempts(ctx context.Context, db DBTX, effectID int64, limit int) ([]Attempt, error) {
	rows, err := db.Query(ctx, listAttemptsSQL, effectID, limit)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := r.Scan(&a.Attempt, &a.At, &a.Outcome, &a.Error, &a.Worker)
		return a, err
	})
	return out, MapError(err)
}

// QueueExtra is what the console's overview adds to a queue's counts.
type QueueExtra struct {
	Queue string
	// Scheduled counts available effects not yet due that were never
	// attempted (Effect.Delay, AvailableAt); Retrying ones are not in it,
	// nor parked ones.
	Scheduled int64
	// NextDue is the earliest due time among them.
	NextDue *time.Time
}

const queueExtrasSQL = `
SELECT queue, count(*), min(available_at)
FROM pgoutbox.effects
WHERE state = 'available' AND available_at > now() AND available_at < 'infinity' AND attempts = 0
GROUP BY queue ORDER BY queue`

// QueueExtras returns, for each queue with scheduled effects, their count
// and the next due time.
func QueueExtras(ctx context.Context, db DBTX) ([]QueueExtra, error) {
	rows, err := db.Query(ctx, queueExtrasSQL)
	if err != nil {
		return nil, MapError(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueExtra, error) {
		var q QueueExtra
		err := r.Scan(&q.Queue, &q.Scheduled, &q.NextDue)
		return q, err
	})
	return out, MapError(err)
}

const nameReplaysSQL = `
UPDATE pgoutbox.effect_attempts SET worker = left($2, 256)
WHERE effect_id = ANY($1::bigint[]) AND outcome = 'replayed' AND worker IS NULL`

// NameReplays records who replayed: the replay rows the trigger wrote for
// ids (in the replay's transaction, worker still empty) get who as their
// worker, so an effect's timeline names the operator the audit names.
func NameReplays(ctx context.Context, db DBTX, ids []int64, who string) error {
	_, err := db.Exec(ctx, nameReplaysSQL, ids, who)
	return MapError(err)
}

// KeyHead is the effect that holds an ordered effect back: the first
// earlier effect of its queue and ordering key that blocks it.
type KeyHead struct {
	ID        int64
	State     string
	Attempts  int
	LastError string
	DueAt     time.Time
}

const keyHeadSQL = `
SELECT p.id, p.state::text, p.attempts, coalesce(p.last_error, ''), coalesce(p.parked_due_at, p.available_at)
FROM pgoutbox.effects e JOIN pgoutbox.effects p ON ` + blockingEarlierSQL + `
WHERE e.id = $1
ORDER BY p.id LIMIT 1`

// HeadOf returns the effect that holds effect id back; found=false when
// none does.
func HeadOf(ctx context.Context, db DBTX, id int64) (h KeyHead, found bool, err error) {
	err = db.QueryRow(ctx, keyHeadSQL, id).Scan(&h.ID, &h.State, &h.Attempts, &h.LastError, &h.DueAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, false, nil
	}
	return h, err == nil, MapError(err)
}
