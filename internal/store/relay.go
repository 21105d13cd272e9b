package store

// The statements of broker relaying (docs/scale-out.md): a relay claims
// effects without counting a delivery attempt, publishes them, and hands them
// over; a broker consumer takes a handed-over effect over under a lease of its
// own, and hands it back to the broker when it must be retried. Every state
// change is fenced like the rest of the engine: by id, lease token, effect
// type and state = 'leased' (take-over: by id, effect type and idempotency
// key, and by the rules below).

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// ClaimRelay leases up to limit available effects of a queue for a relay,
// like Claim but without counting a delivery attempt: publishing to a broker
// is not a delivery. Attempt in the result is the number of deliveries so
// far.
func ClaimRelay(ctx context.Context, db DBTX, queue, owner string, limit int, lease time.Duration) ([]Claimed, error) {
	return claim(ctx, db, queue, owner, limit, lease, 0)
}

// handOverSQL locks each fenced row by primary key (LATERAL: one index
// lookup per effect, whatever the statistics say), then updates exactly those
// rows: the cost is per batch, never per leased row.
const handOverSQL = fencedSQL + `
UPDATE pgoutbox.effects e
SET lease_owner = $4, lease_token = gen_random_uuid(), leased_at = now(),
    lease_expires_at = now() + make_interval(secs => $5)
WHERE e.id = ANY(ARRAY(SELECT id FROM fenced))
RETURNING e.id`

// HandOver records, fenced and in one statement, that the relay's effects
// were accepted by the broker: each stays leased, now owned by owner (the
// hand-off marker) under a fresh token the relay does not know, until
// now()+lease; leased_at restarts, so an effect no consumer takes shows as a
// stalled lease. It returns the ids handed over; a missing id was taken over
// (or recovered) before the hand-over committed.
func HandOver(ctx context.Context, db DBTX, fences []Fence, owner string, lease time.Duration) (map[int64]bool, error) {
	ids, toks, types := fenceArrays(fences)
	rows, err := db.Query(ctx, handOverSQL, ids, toks, types, owner, lease.Seconds())
	if err != nil {
		return nil, MapError(err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, MapError(err)
	}
	out := make(map[int64]bool, len(done))
	for _, id := range done {
		out[id] = true
	}
	return out, nil
}

const releaseSQL = `
UPDATE pgoutbox.effects
SET state = 'available', available_at = now() + make_interval(secs => $4),
    lease_token = NULL, lease_expires_at = NULL, last_error = left($5, 2000)
WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3 AND delivery_started_at IS NULL`

// Release returns a lease to available after delay without judging an
// attempt (a relay that could not publish), fenced. A lease whose delivery
// started is not released (found=false).
func Release(ctx context.Context, db DBTX, f Fence, delay time.Duration, reason string) (found bool, err error) {
	tag, err := db.Exec(ctx, releaseSQL, f.ID, f.Token, f.Type, delay.Seconds(), reason)
	if err != nil {
		return false, MapError(err)
	}
	return tag.RowsAffected() == 1, nil
}

// handBackSQL also records the failed attempt in pgoutbox.effect_attempts
// (migration 00012): the state stays leased, so the history trigger, which
// fires on a change of state, does not see it. The consumer that failed is
// the owner before the update, read from the row the statement locks.
const handBackSQL = `
WITH held AS (
    SELECT id, lease_owner FROM pgoutbox.effects
    WHERE id = $1 AND state::text = 'leased' AND lease_token = $2 AND effect_type = $3
    FOR UPDATE
), upd AS (
    UPDATE pgoutbox.effects e
    SET lease_owner = $4, lease_token = gen_random_uuid(), leased_at = now(),
        lease_expires_at = now() + make_interval(secs => $5), delivery_started_at = NULL, last_error = left($6, 2000)
    FROM held h
    WHERE e.id = h.id AND e.state::text = 'leased' AND e.lease_token = $2
    RETURNING e.id, e.attempts, e.last_error, h.lease_owner
)
INSERT INTO pgoutbox.effect_attempts (effect_id, attempt, outcome, error, worker)
SELECT id, attempts, 'retrying', last_error, left(lease_owner, 256) FROM upd`

// HandBack records, fenced, that a consumer's attempt failed with nothing
// delivered and that the broker will redeliver the effect: it stays leased,
// owned by owner (the hand-off marker) under a fresh token until now()+lease,
// and delivery_started_at is cleared (the handler asserted nothing was sent).
func HandBack(ctx context.Context, db DBTX, f Fence, owner string, lease time.Duration, lastError string) (found bool, err error) {
	tag, err := db.Exec(ctx, handBackSQL, f.ID, f.Token, f.Type, owner, lease.Seconds(), lastError)
	if err != nil {
		return false, MapError(err)
	}
	return tag.RowsAffected() == 1, nil
}

// TakeOverReq names the effect a broker message carries.
type TakeOverReq struct {
	// ID, Type and Key must all match the row.
	ID   int64
	Type string
	Key  string
	// RelayToken is the relay's claim token carried by the message.
	RelayToken uuid.UUID // the relay's claim token carried by the message; uuid.Nil if unknown
}

// Take-over actions.
const (
	TakeTaken     = "taken"     // leased to the consumer, attempts+1
	TakeSettled   = "settled"   // already completed, dead_letter or reconciliation_required
	TakeBusy      = "busy"      // someone else holds a live lease, or the row is locked, or not yet due
	TakeReconcile = "reconcile" // a previous delivery started and was never recorded: now reconciliation_required
	TakeExhausted = "exhausted" // attempts exhausted: now dead_letter
	TakeMissing   = "missing"   // no effect with this id, type and key
)

// TakeOverRes is the outcome of one TakeOverReq.
type TakeOverRes struct {
	// Action is one of the Take* constants.
	Action string
	// State is the row's state after the statement.
	State string
	// Claimed is set when Action is TakeTaken.
	Claimed Claimed
	// Wait is how long until a busy effect may be taken (its lease expires
	// or it becomes due); zero when unknown.
	Wait time.Duration
}

const takeOverSQL = `
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::uuid[])
        WITH ORDINALITY AS t(id, effect_type, idempotency_key, relay_token, ord)
), locked AS (
    -- One primary-key lookup per message (LATERAL), whatever the table's
    -- statistics say. It waits for a row another statement holds (the
    -- relay's hand-over of this very message, a completion) instead of
    -- skipping it: a skipped row would read as busy and cost the message a
    -- JetStream delivery without an attempt. Rows are locked in id order,
    -- like every fenced statement, so take-overs do not deadlock.
    SELECT e.id, e.state, e.attempts, e.max_attempts, e.lease_owner, e.lease_token, e.lease_expires_at,
        e.available_at, e.delivery_started_at, i.relay_token
    FROM (SELECT * FROM input ORDER BY id) i
    CROSS JOIN LATERAL (
        SELECT * FROM pgoutbox.effects x
        WHERE x.id = i.id AND x.effect_type = i.effect_type AND x.idempotency_key = i.idempotency_key
        FOR UPDATE
    ) e
), decided AS (
    SELECT l.id,
        (CASE
            WHEN l.state IN ('completed', 'dead_letter', 'reconciliation_required') THEN 'settled'
            WHEN l.state = 'available' AND l.available_at > now() THEN 'busy'
            WHEN l.state = 'leased' AND l.lease_owner IS DISTINCT FROM $5
                AND l.lease_token IS DISTINCT FROM l.relay_token
                AND l.lease_expires_at >= now() THEN 'busy'
            WHEN l.delivery_started_at IS NOT NULL THEN 'reconcile'
            WHEN l.attempts >= l.max_attempts THEN 'exhausted'
            ELSE 'taken'
        END) AS action,
        -- A parked effect (available_at 'infinity', migration 00014) has no
        -- known wait: 0.
        CASE WHEN l.state <> 'leased' AND NOT isfinite(l.available_at) THEN 0
        ELSE greatest(extract(epoch FROM (CASE WHEN l.state = 'leased' THEN l.lease_expires_at ELSE l.available_at END) - now()), 0)
        END::float8 AS wait_s
    FROM locked l
), upd AS (
    UPDATE pgoutbox.effects e
    SET state = (CASE d.action WHEN 'taken' THEN 'leased' WHEN 'reconcile' THEN 'reconciliation_required'
            ELSE 'dead_letter' END)::pgoutbox.effect_state,
        attempts = CASE WHEN d.action = 'taken' THEN e.attempts + 1 ELSE e.attempts END,
        lease_owner = CASE WHEN d.action = 'taken' THEN $6 ELSE e.lease_owner END,
        lease_token = CASE WHEN d.action = 'taken' THEN gen_random_uuid() END,
        leased_at = CASE WHEN d.action = 'taken' THEN now() ELSE e.leased_at END,
        lease_expires_at = CASE WHEN d.action = 'taken' THEN now() + make_interval(secs => $7) END,
        dead_lettered_at = CASE WHEN d.action = 'exhausted' THEN now() ELSE e.dead_lettered_at END,
        reconciliation_at = CASE WHEN d.action = 'reconcile' THEN now() ELSE e.reconciliation_at END,
        last_error = CASE d.action
            WHEN 'reconcile' THEN 'outcome unknown: delivery started under ' || coalesce(e.lease_owner, '?')
                || ' and its outcome was never recorded'
            WHEN 'exhausted' THEN 'attempts exhausted (last lease: ' || coalesce(e.lease_owner, '?') || ')'
            ELSE e.last_error END
    FROM decided d
    WHERE e.id = d.id AND d.action IN ('taken', 'reconcile', 'exhausted')
        AND e.id = ANY(ARRAY(SELECT id FROM decided))
    RETURNING e.id, e.state::text AS state, e.lease_token, e.attempts, e.max_attempts, e.queue, e.payload,
        e.created_at, e.ordering_key, e.traceparent
)
SELECT i.id,
    coalesce(d.action, CASE WHEN ex.id IS NULL THEN 'missing' ELSE 'busy' END),
    coalesce(u.state, ex.state::text, ''),
    u.lease_token, coalesce(u.attempts, 0), coalesce(u.max_attempts, 0), coalesce(u.queue, ''), u.payload,
    coalesce(u.created_at, now()), coalesce(d.wait_s, 0), coalesce(u.ordering_key, ''),
    coalesce(u.traceparent, '')
FROM input i
LEFT JOIN decided d ON d.id = i.id
LEFT JOIN upd u ON u.id = i.id
LEFT JOIN LATERAL (
    SELECT x.id, x.state FROM pgoutbox.effects x
    WHERE x.id = i.id AND x.effect_type = i.effect_type AND x.idempotency_key = i.idempotency_key
    LIMIT 1
) ex ON true
ORDER BY i.ord`

// TakeOver gives owner, in one statement, a lease of lease on each effect
// named by reqs that a broker consumer may deliver now, and routes the ones
// it may not deliver. An effect may be taken when it is handed over
// (lease_owner = handoff), still leased by the relay that published this very
// message (relay token), leased under an expired lease, or available and due.
// Before a take, the sweeper's rules apply: a started delivery whose outcome
// was never recorded goes to reconciliation_required, exhausted attempts to
// dead_letter. Rows locked by another transaction are reported busy and never
// waited for. Results are in input order; ids must be distinct.
func TakeOver(ctx context.Context, db DBTX, reqs []TakeOverReq, handoff, owner string, lease time.Duration) ([]TakeOverRes, error) {
	n := len(reqs)
	ids, types, keys, toks := make([]int64, n), make([]string, n), make([]string, n), make([]pgtype.UUID, n)
	for i, r := range reqs {
		ids[i], types[i], keys[i], toks[i] = r.ID, r.Type, r.Key, pgUUID(r.RelayToken)
	}
	rows, err := db.Query(ctx, takeOverSQL, ids, types, keys, toks, handoff, owner, lease.Seconds())
	if err != nil {
		return nil, MapError(err)
	}
	defer rows.Close()
	out := make([]TakeOverRes, 0, n)
	for rows.Next() {
		var r TakeOverRes
		var tok *uuid.UUID
		var wait float64
		c := &r.Claimed
		if err := rows.Scan(&c.ID, &r.Action, &r.State, &tok, &c.Attempt, &c.MaxAttempts, &c.Queue, &c.Payload,
			&c.CreatedAt, &wait, &c.OrderingKey, &c.Traceparent); err != nil {
			return nil, err
		}
		if tok != nil {
			c.Token = *tok
		}
		r.Wait = time.Duration(wait * float64(time.Second))
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, MapError(err)
	}
	if len(out) != n {
		return nil, errors.New("store: take-over returned a row count different from its input")
	}
	for i := range out {
		out[i].Claimed.Type, out[i].Claimed.Key = reqs[i].Type, reqs[i].Key
	}
	return out, nil
}
