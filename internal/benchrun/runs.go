package benchrun

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// InsertBacklog writes n effects through r in transactions of batch on db,
// counting them in inserted (nil: not counted).
func InsertBacklog(ctx context.Context, db *pgxpool.Pool, r Runner, n, batch int, inserted *atomic.Int64) error {
	for seq := 0; seq < n; seq += batch {
		k := min(batch, n-seq)
		if err := r.InsertBatch(ctx, db, seq, k); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if inserted != nil {
			inserted.Add(int64(k))
		}
	}
	return nil
}

// DrainConfig configures Drain.
type DrainConfig struct {
	// Effects is the backlog inserted, then drained.
	Effects int
	// InsertBatch is the effects per insert transaction of the backlog.
	InsertBatch int
	// Timeout bounds the drain (0: until ctx ends).
	Timeout time.Duration
	// BeforeStart, when set, runs once the backlog is inserted and its WAL
	// read, just before the drain's clock starts.
	BeforeStart func(ctx context.Context) error
	// Drained, when set, runs as soon as the drain's clock stops, before
	// the runner stops.
	Drained func()
	// Progress shows the phases "insert" and "drain" (nil: nothing).
	Progress Progress
}

// DrainResult is what Drain measured. WAL figures are server-wide bytes.
type DrainResult struct {
	Effects   int
	Insert    time.Duration // inserting the backlog
	Elapsed   time.Duration // starting the runner until the last completion
	WALInsert float64
	WALDrain  float64
	CPU       time.Duration // this process's CPU during the drain
}

// Drain inserts cfg.Effects effects through r on producers, then starts r
// and times it until it completed them all, and stops it. workers is the
// pool WAL positions are read on. An incomplete drain is an error.
func Drain(ctx context.Context, workers, producers *pgxpool.Pool, r Runner, cfg DrainConfig) (DrainResult, error) {
	n := cfg.Effects
	res := DrainResult{Effects: n}
	lsn, err := WALLSN(ctx, workers)
	if err != nil {
		return res, err
	}
	var inserted atomic.Int64
	done := cfg.Progress.start("insert", func() (float64, string) {
		return float64(inserted.Load()) / float64(n), fmt.Sprintf("%d/%d effects", inserted.Load(), n)
	})
	t0 := time.Now()
	err = InsertBacklog(ctx, producers, r, n, cfg.InsertBatch, &inserted)
	res.Insert = time.Since(t0)
	done()
	if err != nil {
		return res, err
	}
	if res.WALInsert, err = WALSince(ctx, workers, lsn); err != nil {
		return res, err
	}
	if cfg.BeforeStart != nil {
		if err := cfg.BeforeStart(ctx); err != nil {
			return res, err
		}
	}
	if lsn, err = WALLSN(ctx, workers); err != nil {
		return res, err
	}
	cpu0 := ProcessCPU()
	start := time.Now()
	if err := r.Start(ctx); err != nil {
		return res, err
	}
	done = cfg.Progress.start("drain", func() (float64, string) {
		c := r.Completed().Load()
		return float64(c) / float64(n), fmt.Sprintf("%d/%d effects, %.0f/s", c, n, float64(c)/time.Since(start).Seconds())
	})
	ok := r.Completed().Wait(ctx, int64(n), cfg.Timeout)
	res.Elapsed = time.Since(start)
	res.CPU = ProcessCPU() - cpu0
	done()
	if cfg.Drained != nil {
		cfg.Drained()
	}
	w, werr := WALSince(context.WithoutCancel(ctx), workers, lsn)
	stop(ctx, r)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if !ok {
		return res, fmt.Errorf("drain: %d of %d completed after %s", r.Completed().Load(), n, cfg.Timeout)
	}
	res.WALDrain = w
	return res, werr
}

// SustainedConfig configures Sustained.
type SustainedConfig struct {
	// Duration is how long the producers insert.
	Duration time.Duration
	// Producers is how many goroutines insert, each ProducerBatch effects
	// per transaction.
	Producers, ProducerBatch int
	// Rate caps the effects/s all producers together insert (0: as fast as
	// the database accepts).
	Rate float64
	// Progress shows the phase "sustained" (nil: nothing).
	Progress Progress
}

// SustainedResult is what Sustained measured.
type SustainedResult struct {
	Elapsed             time.Duration
	Completed, Inserted int64
	// CompletedMarks and InsertedMarks are the counts at every tenth of the
	// run: 11 values, the first 0.
	CompletedMarks, InsertedMarks []int64
}

// Sustained inserts through r on producers for cfg.Duration while r, which
// the caller started, works; the counts are read when the time is up.
func Sustained(ctx context.Context, producers *pgxpool.Pool, r Runner, cfg SustainedConfig) (SustainedResult, error) {
	d := cfg.Duration
	start := time.Now()
	done := cfg.Progress.start("sustained", func() (float64, string) {
		return time.Since(start).Seconds() / d.Seconds(), fmt.Sprintf("%d completed", r.Completed().Load())
	})
	defer done()
	pctx, stopProducers := context.WithDeadline(ctx, start.Add(d))
	defer stopProducers()
	var inserted, seq atomic.Int64
	var perr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	// With a Rate, producer p inserts its k-th batch at
	// start + (k + p/producers) × interval, or at once when behind.
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(cfg.Producers*cfg.ProducerBatch) / cfg.Rate * float64(time.Second))
	}
	for p := range cfg.Producers {
		wg.Go(func() {
			for k := 0; pctx.Err() == nil; k++ {
				if interval > 0 {
					at := start.Add(time.Duration(k)*interval + interval*time.Duration(p)/time.Duration(cfg.Producers))
					select {
					case <-pctx.Done():
						return
					case <-time.After(time.Until(at)):
					}
				}
				s := int(seq.Add(int64(cfg.ProducerBatch))) - cfg.ProducerBatch
				if err := r.InsertBatch(pctx, producers, s, cfg.ProducerBatch); err != nil {
					if pctx.Err() == nil {
						errOnce.Do(func() { perr = err })
					}
					return
				}
				inserted.Add(int64(cfg.ProducerBatch))
			}
		})
	}
	res := SustainedResult{CompletedMarks: []int64{0}, InsertedMarks: []int64{0}}
	tick := time.NewTicker(d / 10)
	for i := 1; i <= 10 && ctx.Err() == nil; i++ {
		select {
		case <-tick.C:
			res.CompletedMarks = append(res.CompletedMarks, r.Completed().Load())
			res.InsertedMarks = append(res.InsertedMarks, inserted.Load())
		case <-ctx.Done():
		}
	}
	tick.Stop()
	res.Elapsed = time.Since(start)
	res.Completed, res.Inserted = r.Completed().Load(), inserted.Load()
	stopProducers()
	wg.Wait()
	if perr != nil {
		return res, fmt.Errorf("producer: %w", perr)
	}
	return res, ctx.Err()
}

// Stamps records one time per effect id; safe for concurrent use.
type Stamps struct {
	mu sync.Mutex
	m  map[int64]time.Time
}

// NewStamps returns an empty Stamps.
func NewStamps() *Stamps { return &Stamps{m: map[int64]time.Time{}} }

// Set records t for id; with first, only when id has no time yet.
func (s *Stamps) Set(id int64, t time.Time, first bool) {
	s.mu.Lock()
	if _, ok := s.m[id]; !ok || !first {
		s.m[id] = t
	}
	s.mu.Unlock()
}

// Get returns id's time and whether it has one.
func (s *Stamps) Get(id int64) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.m[id]
	return t, ok
}

// LatencyConfig configures Latency.
type LatencyConfig struct {
	// Rate is the effects/s enqueued, one per transaction.
	Rate float64
	// Duration is how long the producers enqueue.
	Duration time.Duration
	// Producers is how many goroutines enqueue concurrently.
	Producers int
	// Settle is how long the started runner is left alone first (LISTEN,
	// leader election).
	Settle time.Duration
	// Wait is how long after the last enqueue the effects may take to
	// complete.
	Wait time.Duration
	// Hold keeps each producer transaction open this long after its insert,
	// before its commit (an application's work after the enqueue); 0: none.
	// The runner's InsertOne calls HoldOpen.
	Hold time.Duration
	// WarmUp is how long the producers enqueue at Rate before the measured
	// Duration, unmeasured, so that both pools have grown to what the rate
	// needs (a new connection's first claim or insert parses, plans and
	// loads the catalogs: tens of milliseconds); 0: none.
	WarmUp time.Duration
	// Progress shows the phase "latency" (nil: nothing).
	Progress Progress
}

// warmHold is how long each warm-up transaction stays open, so that the
// Producers warm-up inserts overlap and each takes its own connection.
const warmHold = 100 * time.Millisecond

// LatencyResult is what Latency measured.
type LatencyResult struct {
	Produced int64
	Elapsed  time.Duration // of the producing
	// StartMs are the commit -> delivery start latencies in ms, sorted, of
	// the effects whose delivery started.
	StartMs []float64
	// Completed is whether all Produced effects completed within Wait.
	Completed bool
	// Commits holds, for every produced effect, when its InsertOne
	// returned (the commit acknowledged; this process's clock).
	Commits *Stamps
	// WarmMaxID is the largest id of the warm-up effects: the measured
	// effects all have larger ids (they were inserted after the warm-up
	// committed), so a figure read from the database (claim latency) counts
	// only ids above it.
	WarmMaxID int64
	// Warm counts the warm-up effects (completed before the measuring).
	Warm int64
}

// Latency enqueues through r on producers at cfg.Rate for cfg.Duration while
// r, which the caller started with starts.Set(id, time.Now(), true) called
// at the start of every delivery, works; then waits up to cfg.Wait for the
// effects to complete.
//
// Before measuring, every producer connection enqueues one effect, the
// producers run at Rate for cfg.WarmUp, and the run waits for these
// effects to complete (WarmMaxID): the first statement of a kind on a fresh
// connection parses and plans it and loads the catalogs (40–80 ms for
// pgoutbox's enqueue when 16 connections do it at once on 2 cores, and a
// claim on a worker connection new to the pool pays the same), which is a
// connection's start-up cost, not the latency of a running system. Both
// systems are warmed alike.
func Latency(ctx context.Context, producers *pgxpool.Pool, r Runner, starts *Stamps, cfg LatencyConfig) (LatencyResult, error) {
	var res LatencyResult
	if cfg.Settle > 0 {
		time.Sleep(cfg.Settle)
	}
	warm, err := warmProducers(ctx, producers, r, cfg.Producers)
	if err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	warmed := NewStamps()
	for _, id := range warm {
		warmed.Set(id, time.Time{}, false)
	}
	if cfg.WarmUp > 0 {
		// Negative sequence numbers: the measured effects use 0, 1, …
		if _, err := pace(ctx, producers, r, cfg, -1_000_000_000, cfg.WarmUp, warmed, nil); err != nil {
			return res, fmt.Errorf("warm-up: %w", err)
		}
	}
	for id := range warmed.m {
		res.WarmMaxID = max(res.WarmMaxID, id)
	}
	res.Warm = int64(len(warmed.m))
	if n := res.Warm; !r.Completed().Wait(ctx, n, cfg.Wait) {
		return res, fmt.Errorf("warm-up: %d of %d effects completed within %s", r.Completed().Load(), n, cfg.Wait)
	}
	base := r.Completed().Load()
	commits := NewStamps()
	res.Commits = commits
	start := time.Now()
	if res.Produced, err = pace(ctx, producers, r, cfg, 0, cfg.Duration, commits, cfg.Progress); err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	res.Elapsed = time.Since(start)
	res.Completed = r.Completed().Wait(ctx, base+res.Produced, cfg.Wait)
	commits.mu.Lock()
	for id, c := range commits.m {
		if s, ok := starts.Get(id); ok {
			res.StartMs = append(res.StartMs, float64(s.Sub(c))/float64(time.Millisecond))
		}
	}
	commits.mu.Unlock()
	slices.Sort(res.StartMs)
	return res, ctx.Err()
}

// pace enqueues through r on producers at cfg.Rate for d, one effect per
// transaction from cfg.Producers goroutines, with sequence numbers from
// seq0, and records each commit's time in commits. It returns how many
// it enqueued.
func pace(ctx context.Context, producers *pgxpool.Pool, r Runner, cfg LatencyConfig, seq0 int, d time.Duration, commits *Stamps, progress Progress) (int64, error) {
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	total := int64(d / interval)
	var next, produced atomic.Int64
	var perr error
	var errOnce sync.Once
	start := time.Now()
	done := progress.start("latency", func() (float64, string) {
		return float64(produced.Load()) / float64(total), fmt.Sprintf("%d enqueued", produced.Load())
	})
	defer done()
	var wg sync.WaitGroup
	for range cfg.Producers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
					time.Sleep(wait)
				}
				id, err := r.InsertOne(context.WithValue(ctx, holdKey{}, cfg.Hold), producers, seq0+int(i))
				if err != nil {
					errOnce.Do(func() { perr = err })
					return
				}
				commits.Set(id, time.Now(), false)
				produced.Add(1)
			}
		})
	}
	wg.Wait()
	return produced.Load(), perr
}

// warmProducers runs n concurrent InsertOne calls, each holding its
// transaction open for warmHold so that each takes its own connection of
// producers, and returns the ids they committed.
func warmProducers(ctx context.Context, producers *pgxpool.Pool, r Runner, n int) ([]int64, error) {
	ids := make([]int64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ids[i], errs[i] = r.InsertOne(context.WithValue(ctx, holdKey{}, warmHold), producers, -1-i)
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// holdKey carries LatencyConfig.Hold into a runner's InsertOne.
type holdKey struct{}

// HoldOpen waits for the hold that Latency put into ctx (LatencyConfig.Hold):
// a runner's InsertOne calls it inside its transaction, after the insert.
func HoldOpen(ctx context.Context) {
	if d, _ := ctx.Value(holdKey{}).(time.Duration); d > 0 {
		time.Sleep(d)
	}
}
