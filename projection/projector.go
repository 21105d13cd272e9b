package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
)

// ErrNoTarget is returned by RunBatch and Drain when no target is enabled:
// nothing is claimed.
var ErrNoTarget = errors.New("projection: no projection target is enabled; nothing claimed")

// Target is a projection destination.
type Target interface {
	// Name is "solr" or "graphdb".
	Name() string
	// Project writes the record's current state. Errors are classified with
	// pgoutbox.Retry, RetryAfter, Permanent or Ambiguous.
	Project(ctx context.Context, rec Record, fields map[string]any) error
}

type solrTarget struct{ c *solr.Client }

func (t solrTarget) Name() string { return TargetSolr }
func (t solrTarget) Project(ctx context.Context, rec Record, fields map[string]any) error {
	_, err := t.c.Upsert(ctx, solr.Document{ID: rec.ID, Version: rec.Version, SourceHash: rec.SourceHash, Fields: fields})
	return err
}

type sparqlTarget struct{ c *sparql.Client }

func (t sparqlTarget) Name() string { return TargetGraphDB }
func (t sparqlTarget) Project(ctx context.Context, rec Record, fields map[string]any) error {
	return t.c.Upsert(ctx, sparql.Document{ID: rec.ID, Version: rec.Version, SourceHash: rec.SourceHash, Fields: fields})
}

// Handle is the record.upsert handler. It takes the record's projection
// lock (a transaction-scoped advisory lock keyed by the record id), reads
// the record's current state under it and writes that state to every enabled
// target. Two deliveries of the same record therefore never interleave, and
// each sends the newest committed state: a delivery that was overtaken sends
// the newer state (harmless, replay-safe) instead of its own older one, so an
// older projection can never overwrite a newer one. The Solr target also
// guards with Solr's optimistic concurrency and the stored record version.
// A record that no longer exists is nothing to project (success).
func (a *App) Handle(ctx context.Context, d *pgoutbox.Delivery) error {
	var p Payload
	if err := json.Unmarshal(d.Payload, &p); err != nil || p.RecordID == "" {
		return pgoutbox.Permanent(fmt.Errorf("projection: effect %d: malformed record.upsert payload", d.ID))
	}
	if len(a.targets) == 0 {
		return pgoutbox.Retry(ErrNoTarget)
	}
	return pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockRecordSQL, p.RecordID); err != nil {
			return pgoutbox.Retry(fmt.Errorf("projection: lock record: %w", err))
		}
		rec, found, err := GetRecord(ctx, tx, p.RecordID)
		if err != nil {
			return pgoutbox.Retry(fmt.Errorf("projection: read record: %w", err))
		}
		if !found {
			return nil
		}
		dec := json.NewDecoder(bytes.NewReader(rec.Document))
		dec.UseNumber()
		var fields map[string]any
		if err := dec.Decode(&fields); err != nil {
			return pgoutbox.Permanent(fmt.Errorf("projection: record %q: stored document is not an object", rec.ID))
		}
		for _, t := range a.targets {
			if err := t.Project(ctx, rec, fields); err != nil {
				return err
			}
		}
		return nil
	})
}

// Summary is what a projector run did.
type Summary struct {
	// Claimed effects, by this run.
	Claimed int `json:"claimed"`
	// Projected effects were delivered to every enabled target (completed).
	Projected int `json:"projected"`
	// Retried effects failed transiently and wait for their backoff
	// (state available with attempts > 0; the old name "retry").
	Retried int `json:"retried"`
	// DeadLettered effects failed permanently or ran out of attempts.
	DeadLettered int `json:"dead_lettered"`
	// LeaseLost effects were recovered by a sweeper before their outcome
	// was written; nothing was written.
	LeaseLost int `json:"lease_lost"`
	// Batches run.
	Batches int `json:"batches"`
	// Remaining effects of the queue still to deliver (available, including
	// retries waiting for their backoff, and leased) after the run.
	Remaining int64 `json:"remaining"`
	// RemainingReady of Remaining are claimable now.
	RemainingReady int64 `json:"remaining_ready"`
	// LastErrors holds up to 5 distinct error texts of this run.
	LastErrors []string `json:"last_errors,omitempty"`
}

func (s *Summary) add(o Summary) {
	s.Claimed += o.Claimed
	s.Projected += o.Projected
	s.Retried += o.Retried
	s.DeadLettered += o.DeadLettered
	s.LeaseLost += o.LeaseLost
	s.Batches += o.Batches
	for _, e := range o.LastErrors {
		s.noteError(e)
	}
}

func (s *Summary) noteError(e string) {
	if len(s.LastErrors) >= 5 {
		return
	}
	for _, x := range s.LastErrors {
		if x == e {
			return
		}
	}
	s.LastErrors = append(s.LastErrors, e)
}

// owner names the projector in lease_owner.
func owner() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("projector-%s-%d", host, os.Getpid())
}

// RunBatch claims up to limit record.upsert effects, delivers them with up to
// Config.Concurrency at once, and records each outcome (fenced by its lease).
// With no target enabled it claims nothing and returns ErrNoTarget.
func (a *App) RunBatch(ctx context.Context, limit int) (Summary, error) {
	if !a.Enabled() {
		return Summary{}, ErrNoTarget
	}
	if limit <= 0 {
		limit = BatchDefault
	}
	// record.upsert's dead letters let a record's later versions through
	// (EffectTypes): record it for the claim once, as a Client does at
	// start (a failed attempt is retried by the next batch).
	if !a.orderingRegistered.Load() {
		if err := pgoutbox.RegisterOrdering(ctx, a.pool, []string{Queue}, a.EffectTypes(), a.cfg.Logger); err != nil {
			return Summary{}, err
		}
		a.orderingRegistered.Store(true)
	}
	leases, err := pgoutbox.ClaimLeases(ctx, a.pool, Queue, owner(), limit, a.cfg.Lease)
	if err != nil {
		return Summary{}, err
	}
	s := Summary{Claimed: len(leases), Batches: 1}
	if len(leases) == 0 {
		return s, nil
	}
	typ := a.EffectTypes()[0]
	opts := pgoutbox.DeliverOptions{Timeout: a.cfg.Lease * 3 / 4, BackoffCap: a.cfg.BackoffCap}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, a.cfg.Concurrency)
	for _, l := range leases {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// The engine's delivery: the handler under a panic guard and
			// its timeout, then the fenced completion or failure.
			r, err := l.Deliver(ctx, a.pool, typ, opts)
			mu.Lock()
			defer mu.Unlock()
			if r.Err != nil {
				s.noteError(r.Err.Error())
			}
			switch {
			case errors.Is(err, pgoutbox.ErrLeaseLost):
				s.LeaseLost++
			case err != nil:
				s.noteError(err.Error())
				a.cfg.Logger.Error("recording a projection outcome failed; the lease will expire and be recovered",
					"effect_id", l.ID, "err", err)
			case r.State == pgoutbox.StateCompleted:
				s.Projected++
			case r.State == pgoutbox.StateDeadLetter:
				s.DeadLettered++
			default:
				s.Retried++
			}
		}()
	}
	wg.Wait()
	return s, ctx.Err()
}

// Drain runs batches of batch effects until a batch claims nothing, or
// maxBatches batches ran (0: no cap), or ctx ends. progress, when not nil, is
// called after every batch with that batch's own counts (this batch) and
// the running totals (total, whose Batches numbers this batch).
func (a *App) Drain(ctx context.Context, batch, maxBatches int, progress func(this, total Summary)) (Summary, error) {
	var total Summary
	for maxBatches <= 0 || total.Batches < maxBatches {
		s, err := a.RunBatch(ctx, batch)
		total.add(s)
		if err != nil {
			return total, err
		}
		if progress != nil {
			progress(s, total)
		}
		if s.Claimed == 0 {
			break
		}
	}
	var err error
	total.Remaining, total.RemainingReady, err = a.Remaining(ctx)
	return total, err
}

// Remaining counts the queue's effects still to deliver (available and
// leased) and, of those, the ones claimable now.
func (a *App) Remaining(ctx context.Context) (total, ready int64, err error) {
	b, err := pgoutbox.QueueBacklog(ctx, a.pool, Queue)
	return b.Available + b.Leased, b.Ready, err
}
