package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Broker relaying (docs/design.md, "Scale-out"). When delivery moves onto a
// broker, PostgreSQL stays the source of truth and every transition stays
// fenced:
//
//	available --ClaimRelay--> leased (relay) --HandOver--> leased (HandoffOwner)
//	leased (HandoffOwner | the relay's token | expired) | available
//	    --TakeOver--> leased (consumer, attempts+1) --Run--> completed
//	                                                   | HandBack (retry via the broker)
//	                                                   | Fail (dead_letter, reconciliation_required)
//
// A relay's claim does not count a delivery attempt: attempts counts
// deliveries to the target, which only consumers make. A hand-over keeps the
// effect leased under a long lease (the retry horizon): should the broker
// lose the message, the sweeper recovers the effect when that lease expires
// and the relay publishes it again.

// HandoffOwner is the lease_owner of an effect that a relay handed over to a
// broker (or a consumer handed back for a retry): it is waiting in the broker
// for a consumer to take it over.
const HandoffOwner = "pgoutbox:handoff"

// NotifyChannel is the LISTEN/NOTIFY channel on which the engine announces
// newly available effects; the payload is the queue name.
const NotifyChannel = store.NotifyChannel

func leasesOf(claimed []store.Claimed) []*Lease {
	out := make([]*Lease, len(claimed))
	for i, cl := range claimed {
		out[i] = newLease(cl)
	}
	return out
}

func newLease(cl store.Claimed) *Lease {
	return &Lease{
		Delivery: Delivery{
			ID: cl.ID, Queue: cl.Queue, Type: cl.Type, Key: cl.Key, Payload: cl.Payload,
			Attempt: cl.Attempt, MaxAttempts: cl.MaxAttempts, CreatedAt: cl.CreatedAt,
			LeaseToken: cl.Token.String(),
		},
		fence: store.Fence{ID: cl.ID, Token: cl.Token, Type: cl.Type},
	}
}

func fencesOf(leases []*Lease) []store.Fence {
	out := make([]store.Fence, len(leases))
	for i, l := range leases {
		out[i] = l.fence
	}
	return out
}

// ClaimRelay leases up to limit available effects of queue for a relay
// (owner), oldest (available_at, id) first, with FOR UPDATE SKIP LOCKED. Unlike
// ClaimLeases it does not count a delivery attempt: Attempt is the number of
// deliveries made so far (0 for a new effect).
func ClaimRelay(ctx context.Context, db DB, queue, owner string, limit int, lease time.Duration) ([]*Lease, error) {
	claimed, err := store.ClaimRelay(ctx, db, queue, owner, limit, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: relay claim: %w", err)
	}
	return leasesOf(claimed), nil
}

// HandOver records, in one fenced statement, that the broker accepted the
// relay's leases: each effect stays leased, owned by HandoffOwner under a
// fresh token, until now()+lease (database clock). It returns the ids handed
// over; an id missing from the result was taken over by a consumer before the
// hand-over committed (or its lease was recovered), and nothing was written
// for it. The leases must not be used afterwards.
func HandOver(ctx context.Context, db DB, leases []*Lease, lease time.Duration) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	done, err := store.HandOver(ctx, db, fencesOf(leases), HandoffOwner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: hand over: %w", err)
	}
	return done, nil
}

// Release returns a relay's lease to available after delay (database clock)
// without judging a delivery attempt, recording reason as last_error: the
// relay could not publish the effect. It returns ErrLeaseLost when the lease
// was lost.
func (l *Lease) Release(ctx context.Context, db DB, delay time.Duration, reason string) error {
	ok, err := store.Release(ctx, db, l.fence, delay, reason)
	if err != nil {
		return fmt.Errorf("pgoutbox: release: %w", err)
	}
	if !ok {
		return leaseLost("release", l.ID)
	}
	return nil
}

// HandBack records that this attempt failed with nothing delivered and that
// the broker will deliver the effect again: the effect stays leased, owned by
// HandoffOwner under a fresh token, until now()+lease, and
// delivery_started_at is cleared. herr is recorded as last_error. Use it only
// for an outcome that Run reported as Retry. It returns ErrLeaseLost when the
// lease was lost.
func (l *Lease) HandBack(ctx context.Context, db DB, lease time.Duration, herr error) error {
	msg := ""
	if herr != nil {
		msg = herr.Error()
	}
	ok, err := store.HandBack(ctx, db, l.fence, HandoffOwner, lease, msg)
	if err != nil {
		return fmt.Errorf("pgoutbox: hand back: %w", err)
	}
	if !ok {
		return leaseLost("hand back", l.ID)
	}
	return nil
}

// Handoff names the effect a broker message carries: its id, type and
// idempotency key (all three must match the row), and the lease token of the
// relay that published it.
type Handoff struct {
	// ID, Type and Key must all match the effect's row.
	ID   int64
	Type string
	Key  string
	// RelayToken is the lease token (Delivery.LeaseToken) of the relay's
	// claim under which the message was published.
	RelayToken string
}

// TakeOverAction says what TakeOver did with one Handoff.
type TakeOverAction string

// Take-over actions.
const (
	// TakenOver: the effect is leased to the consumer (attempts+1); deliver
	// it with Lease.Run.
	TakenOver TakeOverAction = "taken"
	// TakeOverSettled: the effect is already completed, dead_letter or
	// reconciliation_required (State says which); acknowledge the message.
	TakeOverSettled TakeOverAction = "settled"
	// TakeOverBusy: another worker holds a live lease on the effect, its row
	// is locked, or it is not yet due; ask the broker to redeliver after
	// Wait.
	TakeOverBusy TakeOverAction = "busy"
	// TakeOverReconciled: a previous delivery of this non-replay-safe effect
	// started and its outcome was never recorded; it is now
	// reconciliation_required and must not be redelivered.
	TakeOverReconciled TakeOverAction = "reconciled"
	// TakeOverExhausted: attempts were exhausted; it is now dead_letter.
	TakeOverExhausted TakeOverAction = "exhausted"
	// TakeOverMissing: no effect has this id, type and key (pruned, or the
	// message belongs to another database).
	TakeOverMissing TakeOverAction = "missing"
)

// TakeOverResult is the outcome of one Handoff.
type TakeOverResult struct {
	// Action is what was done.
	Action TakeOverAction
	// Lease is set when Action is TakenOver.
	Lease *Lease
	// State is the effect's state after the take-over.
	State State
	// Wait is, for TakeOverBusy, how long until the effect may be taken
	// (the holder's lease expires or the effect becomes due); zero when
	// unknown (a locked row).
	Wait time.Duration
}

// TakeOver gives owner a lease of duration lease on each effect a broker
// consumer may deliver now, in one statement, and routes those it may not:
// see TakeOverAction. An effect may be taken when it is handed over
// (HandoffOwner), still leased by the relay that published the message
// (Handoff.RelayToken: the message can arrive before the hand-over commits),
// leased under an expired lease, or available and due. Before a take, the
// sweeper's rules apply, so a crash between delivery and its record is never
// replayed blindly. Results are in input order; a Handoff repeating an earlier
// id in the same call is reported busy.
func TakeOver(ctx context.Context, db DB, handoffs []Handoff, owner string, lease time.Duration) ([]TakeOverResult, error) {
	out := make([]TakeOverResult, len(handoffs))
	reqs := make([]store.TakeOverReq, 0, len(handoffs))
	at := make([]int, 0, len(handoffs))
	seen := make(map[int64]bool, len(handoffs))
	for i, h := range handoffs {
		if seen[h.ID] {
			out[i] = TakeOverResult{Action: TakeOverBusy, Wait: time.Second}
			continue
		}
		seen[h.ID] = true
		tok, err := uuid.Parse(h.RelayToken)
		if err != nil {
			tok = uuid.Nil
		}
		reqs = append(reqs, store.TakeOverReq{ID: h.ID, Type: h.Type, Key: h.Key, RelayToken: tok})
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return out, nil
	}
	res, err := store.TakeOver(ctx, db, reqs, HandoffOwner, owner, lease)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: take over: %w", err)
	}
	for j, r := range res {
		tr := TakeOverResult{State: State(r.State), Wait: r.Wait}
		switch r.Action {
		case store.TakeTaken:
			tr.Action, tr.Lease = TakenOver, newLease(r.Claimed)
		case store.TakeSettled:
			tr.Action = TakeOverSettled
		case store.TakeReconcile:
			tr.Action = TakeOverReconciled
		case store.TakeExhausted:
			tr.Action = TakeOverExhausted
		case store.TakeMissing:
			tr.Action = TakeOverMissing
		default:
			tr.Action = TakeOverBusy
		}
		out[at[j]] = tr
	}
	return out, nil
}

// CompleteLeases marks the leases' effects completed in one fenced statement
// (a group commit; each row is found by primary key, so the cost does not
// grow with the number of leased effects) and returns the ids completed; a missing id had lost its
// lease and nothing was written for it.
func CompleteLeases(ctx context.Context, db DB, leases []*Lease) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	done, err := store.Complete(ctx, db, fencesOf(leases))
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: complete: %w", err)
	}
	out := make(map[int64]bool, len(done))
	for id := range done {
		out[id] = true
	}
	return out, nil
}

// ExtendLeases pushes every lease to now()+d (database clock) in one fenced
// statement and returns the ids still held; a missing id lost its lease.
func ExtendLeases(ctx context.Context, db DB, leases []*Lease, d time.Duration) (map[int64]bool, error) {
	if len(leases) == 0 {
		return map[int64]bool{}, nil
	}
	kept, err := store.Extend(ctx, db, fencesOf(leases), d)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: extend: %w", err)
	}
	return kept, nil
}

// RunStatus says how Lease.Run ended.
type RunStatus int

// Run statuses.
const (
	// RunDelivered: the handler succeeded and registered no transition;
	// complete the effect (CompleteLeases, a group commit).
	RunDelivered RunStatus = iota + 1
	// RunCompleted: the effect was completed in its own transaction, with
	// its OnComplete transitions or as an internal job (TxHandler).
	RunCompleted
	// RunFailed: the handler failed; Outcome, Retry and Delay say how to
	// record it: Lease.HandBack when Retry is true (and the broker can
	// deliver again), else Lease.Fail.
	RunFailed
	// RunLeaseLost: the lease was lost; nothing was written.
	RunLeaseLost
	// RunUnrecorded: the effect was delivered (or may have been) but its
	// completion could not be recorded; it keeps its lease, and when the
	// lease expires it is recovered like a crashed worker's
	// (reconciliation_required when it is not replay-safe).
	RunUnrecorded
)

// RunResult is the outcome of Lease.Run.
type RunResult struct {
	Status RunStatus
	// Outcome is the classified outcome (docs/design.md, "Delivery outcomes").
	Outcome Outcome
	// Err is the handler's (or the engine's) error, for RunFailed and
	// RunUnrecorded.
	Err error
	// ReplaySafe is the effect type's replay safety (always true for an
	// internal job); pass it to Lease.Fail.
	ReplaySafe bool
	// Retry is true for RunFailed when the effect goes back for another
	// attempt (a retry, or an ambiguous outcome of a replay-safe type) and
	// attempts remain.
	Retry bool
	// Delay is the backoff before that attempt (2^attempt s capped, ±10 %;
	// a later Retry-After wins).
	Delay time.Duration
}

// Run delivers the lease's effect exactly as a Client's worker does: an
// internal job (TxHandler) runs inside its fenced completion transaction; a
// type that is not replay-safe gets delivery_started_at committed before its
// handler runs; the handler gets the delivery timeout (t.Timeout, else
// timeout), and a panic is an error; transitions registered with
// Delivery.OnComplete commit with the completion. Run records success itself
// only when it needs a transaction (RunCompleted); every other outcome is
// returned for the caller to record (see RunStatus), so that a broker consumer
// can group-commit completions and redeliver retries through the broker.
func (l *Lease) Run(ctx context.Context, pool *pgxpool.Pool, t EffectType, timeout, backoffCap time.Duration) RunResult {
	if t.Timeout > 0 {
		timeout = t.Timeout
	}
	if t.TxHandler != nil {
		return l.completeIn(ctx, pool, t.TxHandler, true, timeout, backoffCap)
	}
	if t.Handler == nil {
		return l.failed(Retry(fmt.Errorf("no handler registered for effect type %q", l.Type)), true, backoffCap)
	}
	if !t.ReplaySafe {
		// Committed before the request is sent: a crash from here on is
		// routed to reconciliation_required.
		if err := l.MarkStarted(ctx, pool); err != nil {
			if errors.Is(err, ErrLeaseLost) {
				return RunResult{Status: RunLeaseLost, Outcome: OutcomeLeaseLost, Err: err}
			}
			return l.failed(Retry(fmt.Errorf("record delivery start: %w", err)), false, backoffCap)
		}
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	err := call(hctx, func(ctx context.Context) error { return t.Handler(ctx, &l.Delivery) })
	cancel()
	if err != nil {
		return l.failed(err, t.ReplaySafe, backoffCap)
	}
	if len(l.onComplete) == 0 {
		return RunResult{Status: RunDelivered, Outcome: OutcomeSuccess, ReplaySafe: t.ReplaySafe}
	}
	return l.completeIn(ctx, pool, nil, t.ReplaySafe, timeout, backoffCap)
}

func (l *Lease) failed(herr error, replaySafe bool, backoffCap time.Duration) RunResult {
	outcome, _ := classify(herr, replaySafe)
	kind, delay := failRoute(herr, replaySafe, l.Attempt, backoffCap)
	return RunResult{
		Status: RunFailed, Outcome: outcome, Err: herr, ReplaySafe: replaySafe,
		Retry: kind == store.FailRetry && l.Attempt < l.MaxAttempts, Delay: delay,
	}
}

// completeIn mirrors the worker's completion transaction: the fenced
// completion locks the row first, then the job's writes or the delivery's
// transitions join it.
func (l *Lease) completeIn(ctx context.Context, pool *pgxpool.Pool, job TxHandler, replaySafe bool, timeout, backoffCap time.Duration) RunResult {
	var tctx context.Context
	var cancel context.CancelFunc
	if job != nil {
		tctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		// The external effect already happened: the completion must not be
		// cut short by the delivery's own cancellation.
		tctx, cancel = finishCtx(ctx)
	}
	defer cancel()
	txFailed := func(err error) RunResult {
		if replaySafe || job != nil {
			return l.failed(Retry(err), true, backoffCap)
		}
		return RunResult{Status: RunUnrecorded, Outcome: OutcomeAmbiguous, Err: err, ReplaySafe: false}
	}
	tx, err := pool.Begin(tctx)
	if err != nil {
		return txFailed(fmt.Errorf("begin completion: %w", err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(tctx)) }()
	done, err := store.Complete(tctx, tx, []store.Fence{l.fence})
	if err != nil {
		return txFailed(fmt.Errorf("complete: %w", err))
	}
	if _, ok := done[l.ID]; !ok {
		return RunResult{Status: RunLeaseLost, Outcome: OutcomeLeaseLost, Err: leaseLost("complete", l.ID)}
	}
	if job != nil {
		if err := call(tctx, func(ctx context.Context) error { return job(ctx, tx, &l.Delivery) }); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			return l.failed(err, true, backoffCap)
		}
	}
	for _, fn := range l.onComplete {
		if err := fn(tctx, tx); err != nil {
			_ = tx.Rollback(context.WithoutCancel(tctx))
			return txFailed(fmt.Errorf("completion transition: %w", err))
		}
	}
	// As in the worker: the commit is not cut short by the delivery's
	// cancellation or the job's timeout. Once the fenced completion holds
	// the row, interrupting the COMMIT only makes its outcome unknown, and a
	// commit that succeeded on the server would be reported unrecorded.
	cctx, ccancel := finishCtx(ctx)
	defer ccancel()
	if err := tx.Commit(cctx); err != nil {
		return RunResult{Status: RunUnrecorded, Outcome: OutcomeAmbiguous, Err: fmt.Errorf("completion commit: %w", err),
			ReplaySafe: replaySafe || job != nil}
	}
	return RunResult{Status: RunCompleted, Outcome: OutcomeSuccess, ReplaySafe: replaySafe || job != nil}
}

// RetryHorizon is the longest time an effect handed to a broker may keep
// being delivered: maxAttempts attempts, each taking at most perAttempt (a
// consumer's lease: a crashed consumer's effect is taken over when its lease
// expires) and followed by the largest backoff (2^attempt s capped at
// backoffCap, +10 % jitter), plus one more perAttempt for the last
// redelivery. A broker's duplicate window must be at least this long, so
// that the relay publishing an effect again within it (after a relay crash,
// or when a hand-over lease expires) never stores a second message.
func RetryHorizon(maxAttempts int, backoffCap, perAttempt time.Duration) time.Duration {
	if maxAttempts <= 0 {
		maxAttempts = MaxAttemptsDefault
	}
	if backoffCap <= 0 {
		backoffCap = BackoffCapDefault
	}
	total := perAttempt
	for a := 1; a <= maxAttempts; a++ {
		b := math.Pow(2, float64(a)) * float64(time.Second)
		if b > float64(backoffCap) {
			b = float64(backoffCap)
		}
		total += perAttempt + time.Duration(b*1.1)
	}
	return total
}
