package main

import (
	"context"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// The held-xmin scenario (-xmin, issue 32 "Flat"): for every system of
// -systems, on a fresh database, the system's workers run while producers
// enqueue at -xmin-load (50 %) of the capacity measured first; the run has
// three phases:
//
//	clean  -xmin-clean long: nothing else on the server
//	held   -xmin-hold long: a session of the same database took an XID
//	       (BEGIN; SELECT txid_current()) and stays idle in transaction, so
//	       that no row version deleted or updated since can be removed
//	after  the hold ended, until the completion rate is back at the clean
//	       rate and the backlog at the clean phase's (at least as long as the
//	       clean phase, at most -xmin-after)
//
// Every -xmin-interval it samples the completions (the system's own counter,
// as the other scenarios count them), the effects inserted, the backlog and
// the dead tuples of the system's tables (pg_stat_user_tables.n_dead_tup,
// which is cheap and approximate); at the end of every phase it also reads
// the exact count with pgstattuple (-xmin-pgstattuple: a full scan of every
// table, beside the workload; the phase goes on until the scan ends, so the
// held phase's scan sees the XID still held). Capacity is the completion rate of a short unbounded
// sustained run (-xmin-capacity: producers as fast as the database accepts
// while the workers drain), not of a pre-inserted drain: it is what the
// system sustains with producers and workers sharing the server, as in the
// phases; -xmin-rate sets the producers' rate instead.

// xminOptions are the -xmin-* flags.
type xminOptions struct {
	on        bool
	clean     time.Duration
	hold      time.Duration
	after     time.Duration
	interval  time.Duration
	capacity  time.Duration
	rate      float64
	load      float64
	tolerance float64
	stattuple bool
}

// register defines the -xmin flags on fs.
func (x *xminOptions) register(fs *flag.FlagSet) {
	fs.BoolVar(&x.on, "xmin", false, "run the held-xmin scenario instead of the scenarios: producers at -xmin-load of capacity, a clean phase, a session holding an XID, then recovery (completions/s and dead tuples over time; docs/benchmarks.md)")
	fs.DurationVar(&x.clean, "xmin-clean", 5*time.Minute, "xmin: length of the clean phase")
	fs.DurationVar(&x.hold, "xmin-hold", 10*time.Minute, "xmin: how long a session idle in transaction holds an XID")
	fs.DurationVar(&x.after, "xmin-after", 5*time.Minute, "xmin: the phase after the hold lasts until the completion rate and the backlog are back at the clean phase's, at least -xmin-clean and at most this long")
	fs.DurationVar(&x.interval, "xmin-interval", 5*time.Second, "xmin: sampling interval (completions/s, dead tuples)")
	fs.DurationVar(&x.capacity, "xmin-capacity", 30*time.Second, "xmin: length of the unbounded sustained run that measures capacity (unless -xmin-rate)")
	fs.Float64Var(&x.rate, "xmin-rate", 0, "xmin: effects/s the producers insert (0: -xmin-load × the measured capacity)")
	fs.Float64Var(&x.load, "xmin-load", 0.5, "xmin: producers' rate as a fraction of the measured capacity")
	fs.BoolVar(&x.stattuple, "xmin-pgstattuple", true, "xmin: count the dead tuples exactly with pgstattuple at the end of every phase (a full scan of the tables, during which the phase goes on)")
	fs.Float64Var(&x.tolerance, "xmin-tolerance", 0.1, "xmin: an interval is at the clean rate when its completions/s are at least (1 - this) × the clean phase's")
}

func (x *xminOptions) validate() error {
	if x.clean < x.interval || x.hold < x.interval || x.after < x.interval || x.interval < 100*time.Millisecond {
		return fmt.Errorf("-xmin-clean, -xmin-hold and -xmin-after must be at least -xmin-interval (at least 100ms)")
	}
	if x.rate < 0 || x.load <= 0 || x.tolerance < 0 || x.tolerance >= 1 || (x.rate == 0 && x.capacity < time.Second) {
		return fmt.Errorf("-xmin-rate >= 0, -xmin-load > 0, 0 <= -xmin-tolerance < 1, -xmin-capacity >= 1s")
	}
	return nil
}

// The phases, in order.
const (
	phaseClean = "clean"
	phaseHeld  = "held"
	phaseAfter = "after"
)

// phaseDue reports whether phase, begun inPhase ago, has run its time:
// -xmin-clean, -xmin-hold, or for the phase after the hold its bound
// -xmin-after (it ends earlier once recovered).
func phaseDue(phase string, inPhase time.Duration, x *xminOptions) bool {
	switch phase {
	case phaseClean:
		return inPhase >= x.clean
	case phaseHeld:
		return inPhase >= x.hold
	}
	return inPhase >= x.after
}

// xminSample is one sampling interval.
type xminSample struct {
	T          float64 `json:"t"`       // seconds since the clean phase began, at the interval's end
	Seconds    float64 `json:"seconds"` // the interval's length
	Phase      string  `json:"phase"`   // the phase the interval ran in
	Completed  int64   `json:"completed"`
	Inserted   int64   `json:"inserted"`
	Rate       float64 `json:"rate"`        // completions/s in the interval
	InsertRate float64 `json:"insert_rate"` // effects inserted/s in the interval
	Backlog    int64   `json:"backlog"`     // inserted - completed since the clean phase began, at the end
	DeadTup    int64   `json:"n_dead_tup"`  // pg_stat_user_tables.n_dead_tup, summed over the tables (-1: not read)
}

// phaseRate is the completions/s over the intervals of phase, skipping its
// first skip intervals (a phase's first interval can carry the previous
// one's transient).
func phaseRate(samples []xminSample, phase string, skip int) float64 {
	var n int64
	var secs float64
	seen := 0
	for _, s := range samples {
		if s.Phase != phase {
			continue
		}
		if seen++; seen <= skip {
			continue
		}
		n += s.Completed
		secs += s.Seconds
	}
	if secs == 0 {
		return math.NaN()
	}
	return float64(n) / secs
}

// minRate is the lowest rate of phase's intervals at least minSecs long
// (a phase's last, short interval is its pgstattuple scan's; NaN without
// one).
func minRate(samples []xminSample, phase string, minSecs float64) float64 {
	m := math.NaN()
	for _, s := range samples {
		if s.Phase == phase && s.Seconds >= minSecs && (math.IsNaN(m) || s.Rate < m) {
			m = s.Rate
		}
	}
	return m
}

// ratio is a / b, NaN when b is zero or either is NaN.
func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// recovery returns the seconds from the end of the held phase to the start
// of the first interval after it from which consecutive intervals in a row
// (fewer when the run ends first) complete at least threshold effects/s: 0
// when the first interval after the hold is already there; the resolution
// is the sampling interval. ok is false when no such interval came.
func recovery(samples []xminSample, threshold float64, consecutive int) (secs float64, ok bool) {
	holdEnd, after := math.NaN(), -1
	for i, s := range samples {
		if s.Phase == phaseHeld {
			holdEnd = s.T
		}
		if s.Phase == phaseAfter && after < 0 {
			after = i
		}
	}
	if after < 0 || math.IsNaN(holdEnd) {
		return math.NaN(), false
	}
	for i := after; i < len(samples); i++ {
		good := true
		for j := i; j < min(len(samples), i+consecutive); j++ {
			if samples[j].Rate < threshold {
				good = false
				break
			}
		}
		if good {
			return samples[i].T - samples[i].Seconds - holdEnd, true
		}
	}
	return math.NaN(), false
}

// catchUp returns the seconds from the end of the held phase to the end of
// the first interval after it whose backlog is at most limit: 0 when the
// backlog at the hold's end already was (ok false when none is).
func catchUp(samples []xminSample, limit int64) (secs float64, ok bool) {
	holdEnd := math.NaN()
	var atEnd int64
	for _, s := range samples {
		switch s.Phase {
		case phaseHeld:
			holdEnd, atEnd = s.T, s.Backlog
		case phaseAfter:
			if math.IsNaN(holdEnd) {
				return math.NaN(), false
			}
			if atEnd <= limit {
				return 0, true
			}
			if s.Backlog <= limit {
				return s.T - holdEnd, true
			}
		}
	}
	return math.NaN(), false
}

// maxBacklog is the largest backlog of phase's intervals (0 without one).
func maxBacklog(samples []xminSample, phase string) int64 {
	var m int64
	for _, s := range samples {
		if s.Phase == phase {
			m = max(m, s.Backlog)
		}
	}
	return m
}

// xminSystem is one system's run.
type xminSystem struct {
	System     string       `json:"system"`
	Figures    result       `json:"figures"`
	HolderXID  int64        `json:"holder_xid,omitempty"`
	Pgstattup  []deadTuples `json:"pgstattuple,omitempty"` // at the end of every phase
	Samples    []xminSample `json:"samples"`
	Error      string       `json:"error,omitempty"`
	HoldStartT float64      `json:"hold_start_t"` // seconds since the clean phase began
	HoldEndT   float64      `json:"hold_end_t"`
}

// deadTuples is an exact count of the dead tuples of the system's tables.
type deadTuples struct {
	Phase   string           `json:"phase"` // at the end of this phase
	Dead    int64            `json:"dead_tuples"`
	Bytes   int64            `json:"table_bytes"` // heaps only (pgstattuple's table_len)
	Tables  map[string]int64 `json:"per_table"`
	Seconds float64          `json:"scan_seconds"`
	Error   string           `json:"error,omitempty"`
}

// xminFile is what -xmin writes with -json.
type xminFile struct {
	runInfo
	Systems []xminSystem `json:"systems"`
}

// xminFigures are the printed figures, in order.
var xminFigures = []figure{
	{"capacity", "capacity: completed effects/s, unbounded producers (-xmin-capacity)", 0},
	{"rate", "producers' rate, effects/s", 0},
	{"clean_rate", "clean phase: completed effects/s", 0},
	{"held_rate", "held phase: completed effects/s", 0},
	{"held_ratio", "held / clean (goal >= 0.8)", 2},
	{"held_min_ratio", "worst held interval / clean", 2},
	{"recover_s", "seconds from the hold's end to the clean rate (goal <= 60)", 0},
	{"catchup_s", "seconds from the hold's end to the clean phase's backlog", 0},
	{"backlog_clean", "largest backlog, clean phase", 0},
	{"backlog_held", "largest backlog, held phase", 0},
	{"dead_max", "most dead tuples sampled (n_dead_tup)", 0},
	{"pgst_clean", "dead tuples at the end of the clean phase (pgstattuple)", 0},
	{"pgst_held", "dead tuples at the end of the held phase (pgstattuple)", 0},
	{"pgst_after", "dead tuples at the end of the run (pgstattuple)", 0},
	{"heap_mb_held", "heap MB at the end of the held phase (pgstattuple)", 1},
}

func runXmin(ctx context.Context, o *options, admin *pgxpool.Pool, systems []system, stdout, stderr io.Writer) error {
	x := &o.xmin
	if err := x.validate(); err != nil {
		return err
	}
	f := &xminFile{runInfo: newRunInfo(ctx, admin,
		"autovacuum", "autovacuum_naptime", "fsync", "synchronous_commit", "shared_buffers", "max_wal_size")}
	began := time.Now()
	tag := fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
	for si, sys := range systems {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !supports(sys, "sustained") {
			continue
		}
		t0 := time.Now()
		res := xminRun(ctx, o, admin, sys, fmt.Sprintf("pgoutbox_bench_%s_x%d", tag, si), stderr)
		if res.Error != "" {
			fmt.Fprintf(stderr, "xmin %-24s FAILED: %s\n", sys.Name(), res.Error)
		} else {
			fmt.Fprintf(stderr, "xmin %-24s clean %s/s, held %s (%s), recovered in %s s (%.0fs)\n", sys.Name(),
				fmtNum(res.Figures["clean_rate"], 0), fmtNum(res.Figures["held_rate"], 0), fmtNum(res.Figures["held_ratio"], 2),
				fmtNum(res.Figures["recover_s"], 0), time.Since(t0).Seconds())
		}
		f.Systems = append(f.Systems, res)
	}
	f.finish(began)
	fmt.Fprintf(stdout, "PostgreSQL %s, %d CPUs, %s, load average before %s, after %s; %s\n",
		f.PostgreSQL, f.CPUs, f.Go, f.LoadBefore, f.LoadAfter, time.Since(began).Round(time.Second))
	fmt.Fprintf(stdout, "server settings: %s\nflags: %s\n\n", f.Settings, f.Flags)
	printXmin(stdout, f)
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, f); err != nil {
			return err
		}
	}
	if o.svgDir != "" {
		if err := os.MkdirAll(o.svgDir, 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(o.svgDir, "xmin.svg"), []byte(drawXmin(f)), 0o644)
	}
	return nil
}

// printXmin prints one markdown table: a row per figure, a column per system.
func printXmin(w io.Writer, f *xminFile) {
	rows := [][]string{{"held xmin"}}
	for _, s := range f.Systems {
		rows[0] = append(rows[0], s.System)
	}
	for _, fig := range xminFigures {
		row := []string{fig.label}
		for _, s := range f.Systems {
			v := math.NaN()
			if x, ok := s.Figures[fig.key]; ok {
				v = x
			}
			row = append(row, fmtNum(v, fig.decimals))
		}
		rows = append(rows, row)
	}
	writeMarkdown(w, rows)
	for _, s := range f.Systems {
		if s.Error != "" {
			fmt.Fprintf(w, "\n%s failed: %s\n", s.System, s.Error)
		}
	}
}

// xminRun runs the three phases for one system on a fresh database.
func xminRun(ctx context.Context, o *options, admin *pgxpool.Pool, sys system, db string, stderr io.Writer) xminSystem {
	out := xminSystem{System: sys.Name(), Figures: result{}}
	if err := xminPhases(ctx, o, admin, sys, db, stderr, &out); err != nil {
		out.Error = err.Error()
	}
	return out
}

func xminPhases(ctx context.Context, o *options, admin *pgxpool.Pool, sys system, db string, stderr io.Writer, out *xminSystem) error {
	x := &o.xmin
	dsn, drop, err := freshDB(ctx, admin, o.dsn, db, o.keep)
	if err != nil {
		return err
	}
	defer drop()
	if err := sys.Migrate(ctx, dsn); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	pool, err := benchrun.OpenPool(ctx, dsn, o.poolConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	prod, err := benchrun.OpenPool(ctx, dsn, o.producerConns)
	if err != nil {
		return err
	}
	defer prod.Close()
	// A pool of its own for the statistics, so that sampling never waits
	// behind the workload.
	stats, err := benchrun.OpenPool(ctx, dsn, 4)
	if err != nil {
		return err
	}
	defer stats.Close()
	stattuple := x.stattuple
	if stattuple {
		if _, err := stats.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple"); err != nil {
			fmt.Fprintf(stderr, "xmin: no pgstattuple (%v): dead tuples from pg_stat_user_tables only\n", err)
			stattuple = false
		}
	}
	r, err := sys.Prepare(ctx, pool, workerConfig{workers: o.workers})
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), benchrun.StopTimeout)
		_ = r.Stop(stopCtx)
		cancel()
	}()

	rate := x.rate
	out.Figures["capacity"] = math.NaN()
	if rate == 0 {
		sr, err := benchrun.Sustained(ctx, prod, r, benchrun.SustainedConfig{
			Duration: x.capacity, Producers: o.producers, ProducerBatch: o.producerBatch,
		})
		if err != nil {
			return fmt.Errorf("capacity: %w", err)
		}
		capacity := float64(sr.Completed) / sr.Elapsed.Seconds()
		out.Figures["capacity"] = capacity
		rate = x.load * capacity
		// Start the phases with the capacity run's backlog drained.
		if !r.Completed().Wait(ctx, sr.Inserted, o.timeout) {
			return fmt.Errorf("capacity: %d of %d completed after %s", r.Completed().Load(), sr.Inserted, o.timeout)
		}
		fmt.Fprintf(stderr, "xmin %-24s capacity %s effects/s (inserted %s/s): producers at %s/s\n", sys.Name(),
			fmtNum(capacity, 0), fmtNum(float64(sr.Inserted)/sr.Elapsed.Seconds(), 0), fmtNum(rate, 0))
	}
	out.Figures["rate"] = rate

	var inserted atomic.Int64
	c0 := r.Completed().Load()
	pctx, stopProducers := context.WithCancel(ctx)
	defer stopProducers()
	perr := make(chan error, 1)
	var pwg sync.WaitGroup
	start := time.Now()
	// Sequence numbers (and so idempotency keys) past the capacity run's.
	pwg.Go(func() { perr <- produce(pctx, prod, r, rate, o.producers, o.producerBatch, 1<<40, start, &inserted) })

	var holder pgx.Tx
	var holderConn *pgx.Conn
	release := func() {
		if holder != nil {
			_ = holder.Rollback(context.WithoutCancel(ctx))
			_ = holderConn.Close(context.WithoutCancel(ctx))
			holder, holderConn = nil, nil
		}
	}
	defer release()
	tick := time.NewTicker(x.interval)
	defer tick.Stop()
	phase := phaseClean
	last, lastC, lastI := start, int64(0), int64(0)
	sample := func() {
		now := time.Now()
		c, ins := r.Completed().Load()-c0, inserted.Load()
		s := xminSample{
			T: now.Sub(start).Seconds(), Seconds: now.Sub(last).Seconds(), Phase: phase,
			Completed: c - lastC, Inserted: ins - lastI, Backlog: ins - c, DeadTup: deadTupSampled(ctx, stats, sys.Tables()),
		}
		s.Rate, s.InsertRate = float64(s.Completed)/s.Seconds, float64(s.Inserted)/s.Seconds
		out.Samples = append(out.Samples, s)
		last, lastC, lastI = now, c, ins
		fmt.Fprintf(stderr, "xmin %-24s %6.0fs %-5s %8s/s completed, backlog %s, n_dead_tup %s\n", sys.Name(), s.T, phase,
			fmtNum(s.Rate, 0), fmtNum(float64(s.Backlog), 0), fmtNum(float64(s.DeadTup), 0))
	}
	// A phase ends with its pgstattuple scan, while the workload goes on
	// (the held phase's sees the XID still held), and a sample of the
	// scan's time, in that phase.
	endPhase := func() {
		if stattuple {
			out.Pgstattup = append(out.Pgstattup, pgstattuple(ctx, stats, sys.Tables(), phase))
			sample()
		}
	}
	phaseStart := start
	minAfter := min(x.clean, x.after)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-perr:
			return fmt.Errorf("producer: %w", err)
		case <-tick.C:
		}
		sample()
		// A tick's jitter does not cost the phase an interval.
		due := phaseDue(phase, time.Since(phaseStart)+x.interval/100, x)
		switch {
		case phase == phaseClean && due:
			endPhase()
			if holderConn, err = pgx.Connect(ctx, dsn); err != nil {
				return fmt.Errorf("holder: %w", err)
			}
			if holder, err = holderConn.Begin(ctx); err != nil {
				return fmt.Errorf("holder: %w", err)
			}
			if err := holder.QueryRow(ctx, "SELECT txid_current()").Scan(&out.HolderXID); err != nil {
				return fmt.Errorf("holder: %w", err)
			}
			phase, phaseStart = phaseHeld, time.Now()
			out.HoldStartT = phaseStart.Sub(start).Seconds()
			tick.Reset(x.interval) // the hold ends on a tick
		case phase == phaseHeld && due:
			endPhase()
			release()
			phase, phaseStart = phaseAfter, time.Now()
			out.HoldEndT = phaseStart.Sub(start).Seconds()
			tick.Reset(x.interval)
		case phase == phaseAfter:
			cleanRate := phaseRate(out.Samples, phaseClean, 1)
			_, recovered := recovery(out.Samples, (1-x.tolerance)*cleanRate, 2)
			_, caught := catchUp(out.Samples, backlogLimit(out.Samples, o))
			if (recovered && caught && time.Since(phaseStart) >= minAfter) || due {
				endPhase()
				stopProducers()
				pwg.Wait()
				xminFigs(out, x, o)
				return nil
			}
		}
	}
}

// backlogLimit is the clean phase's largest backlog plus one round of
// producer batches (the batches in flight at a sample).
func backlogLimit(samples []xminSample, o *options) int64 {
	return maxBacklog(samples, phaseClean) + int64(o.producers*o.producerBatch)
}

// xminFigs computes the figures from the samples.
func xminFigs(out *xminSystem, x *xminOptions, o *options) {
	f := out.Figures
	clean := phaseRate(out.Samples, phaseClean, 1)
	f["clean_rate"] = clean
	f["held_rate"] = phaseRate(out.Samples, phaseHeld, 0)
	f["held_ratio"] = ratio(f["held_rate"], clean)
	f["held_min_ratio"] = ratio(minRate(out.Samples, phaseHeld, x.interval.Seconds()/2), clean)
	f["recover_s"], _ = recovery(out.Samples, (1-x.tolerance)*clean, 2)
	f["catchup_s"], _ = catchUp(out.Samples, backlogLimit(out.Samples, o))
	f["backlog_clean"] = float64(maxBacklog(out.Samples, phaseClean))
	f["backlog_held"] = float64(maxBacklog(out.Samples, phaseHeld))
	var dead int64 = -1
	for _, s := range out.Samples {
		dead = max(dead, s.DeadTup)
	}
	f["dead_max"] = math.NaN()
	if dead >= 0 {
		f["dead_max"] = float64(dead)
	}
	for _, k := range []string{"pgst_clean", "pgst_held", "pgst_after", "heap_mb_held"} {
		f[k] = math.NaN()
	}
	for _, d := range out.Pgstattup {
		if d.Error != "" {
			continue
		}
		f["pgst_"+d.Phase] = float64(d.Dead)
		if d.Phase == phaseHeld {
			f["heap_mb_held"] = float64(d.Bytes) / (1 << 20)
		}
	}
}

// produce inserts rate effects/s through r, producers goroutines of batch
// effects per transaction, sequence numbers from seq0, until ctx ends;
// producer p inserts its k-th batch at start + (k + p/producers) ×
// interval, or at once when behind.
func produce(ctx context.Context, db *pgxpool.Pool, r runner, rate float64, producers, batch int, seq0 int64, start time.Time, inserted *atomic.Int64) error {
	interval := time.Duration(float64(producers*batch) / rate * float64(time.Second))
	var seq atomic.Int64
	seq.Store(seq0)
	var wg sync.WaitGroup
	var once sync.Once
	var perr error
	for p := range producers {
		wg.Go(func() {
			for k := 0; ; k++ {
				at := start.Add(time.Duration(k)*interval + interval*time.Duration(p)/time.Duration(producers))
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(at)):
				}
				s := int(seq.Add(int64(batch))) - batch
				if err := r.InsertBatch(ctx, db, s, batch); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { perr = err })
					}
					return
				}
				inserted.Add(int64(batch))
			}
		})
	}
	wg.Wait()
	if perr != nil {
		return perr
	}
	// Stopped by the caller: wait for it to stop listening.
	<-ctx.Done()
	return nil
}

// deadTupSampled sums pg_stat_user_tables.n_dead_tup over tables (-1 when
// it cannot be read).
func deadTupSampled(ctx context.Context, pool *pgxpool.Pool, tables []string) int64 {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables
		WHERE relid = ANY (SELECT t::regclass FROM unnest($1::text[]) t)`, tables).Scan(&n); err != nil {
		return -1
	}
	return n
}

// pgstattuple counts the dead tuples of tables exactly (a full scan each).
func pgstattuple(ctx context.Context, pool *pgxpool.Pool, tables []string, phase string) deadTuples {
	d := deadTuples{Phase: phase, Tables: map[string]int64{}}
	t0 := time.Now()
	for _, t := range tables {
		var dead, bytes int64
		if err := pool.QueryRow(ctx, "SELECT dead_tuple_count, table_len FROM pgstattuple($1::regclass)", t).Scan(&dead, &bytes); err != nil {
			d.Error = err.Error()
			break
		}
		d.Tables[t] = dead
		d.Dead += dead
		d.Bytes += bytes
	}
	d.Seconds = time.Since(t0).Seconds()
	return d
}

// drawXmin draws the time series of every system: completions/s, backlog
// and dead tuples against time, the held phase shaded.
func drawXmin(f *xminFile) string {
	const w, ph = 920, 280
	flags := wrapWords("flags: "+f.Flags, 140)
	top := 96 + 14*(len(flags)-1)
	panels := []struct {
		title string
		y     func(xminSample) float64
	}{
		{"completed effects/s (each interval)", func(s xminSample) float64 { return s.Rate }},
		{"backlog (inserted − completed)", func(s xminSample) float64 { return float64(s.Backlog) }},
		{"dead tuples on the system's tables (n_dead_tup)", func(s xminSample) float64 {
			if s.DeadTup < 0 {
				return math.NaN()
			}
			return float64(s.DeadTup)
		}},
	}
	height := top + 4 + len(panels)*ph + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		w, height, w, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, height)
	text(&b, 12, 22, 16, "start", "bold", "Held xmin: a session idle in transaction holding an XID (shaded) while producers run")
	text(&b, 12, 40, 11, "start", "", f.caption())
	text(&b, 12, 55, 11, "start", "", "Server: "+f.Settings)
	for i, l := range flags {
		text(&b, 12, float64(70+14*i), 11, "start", "", l)
	}
	lx, ly := 12.0, float64(top-8)
	for i, s := range f.Systems {
		c := palette[i%len(palette)]
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2.5"/>`+"\n", lx, ly-4, lx+24, ly-4, c)
		label := s.System
		if s.Figures["rate"] > 0 {
			label += fmt.Sprintf(" (producers %s/s)", shortNum(s.Figures["rate"]))
		}
		text(&b, lx+30, ly, 12, "start", "", label)
		lx += 40 + 7*float64(len([]rune(label)))
	}
	tmax, holdStart, holdEnd := 0.0, math.NaN(), math.NaN()
	for _, s := range f.Systems {
		for _, p := range s.Samples {
			tmax = max(tmax, p.T)
		}
		if s.HoldEndT > 0 && math.IsNaN(holdStart) {
			holdStart, holdEnd = s.HoldStartT, s.HoldEndT
		}
	}
	if tmax == 0 {
		tmax = 1
	}
	for i, p := range panels {
		oy := float64(top + 4 + i*ph)
		pw, phh := float64(w-marginL-marginR), float64(ph-marginT-marginB)
		px, py := float64(marginL), oy+marginT
		text(&b, px, oy+20, 13, "start", "bold", p.title)
		ymax := 0.0
		for _, s := range f.Systems {
			for _, q := range s.Samples {
				if y := p.y(q); !math.IsNaN(y) {
					ymax = max(ymax, y)
				}
			}
		}
		step := niceStep(ymax)
		ytop := step * math.Ceil(ymax/step)
		if ytop == 0 {
			ytop = 1
		}
		xpos := func(t float64) float64 { return px + t/tmax*pw }
		ypos := func(v float64) float64 { return py + phh - v/ytop*phh }
		if !math.IsNaN(holdStart) {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f3e3c3"/>`+"\n",
				xpos(holdStart), py, xpos(holdEnd)-xpos(holdStart), phh)
		}
		for v := 0.0; v <= ytop+step/2; v += step {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", px, ypos(v), px+pw, ypos(v))
			text(&b, px-6, ypos(v)+4, 11, "end", "", shortNum(v))
		}
		fmt.Fprintf(&b, `<polyline points="%.1f,%.1f %.1f,%.1f %.1f,%.1f" fill="none" stroke="#333"/>`+"\n", px, py, px, py+phh, px+pw, py+phh)
		tstep := niceStep(tmax)
		for t := 0.0; t <= tmax+tstep/100; t += tstep {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", xpos(t), py+phh, xpos(t), py+phh+4)
			text(&b, xpos(t), py+phh+17, 11, "middle", "", shortNum(t))
		}
		text(&b, px+pw/2, py+phh+36, 11, "middle", "", "seconds since the clean phase began")
		for si, s := range f.Systems {
			var pts []string
			for _, q := range s.Samples {
				if y := p.y(q); !math.IsNaN(y) {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(q.T), ypos(y)))
				}
			}
			if len(pts) > 0 {
				fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.8"><title>%s</title></polyline>`+"\n",
					strings.Join(pts, " "), palette[si%len(palette)], html.EscapeString(s.System))
			}
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// wrapWords splits s into lines of at most n characters at spaces.
func wrapWords(s string, n int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > n {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return append(lines, line)
}
