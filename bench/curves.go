package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// The cost curves (-curves): each point drains a pre-inserted backlog with
// worker processes (this binary re-executed with -child, as in the scale
// scenario) on a fresh database, for every system of -systems. Three axes:
// the backlog size (-curve-backlogs, one process, -payload-bytes), the
// payload size (-curve-payloads, -curve-n effects, one process) and the
// number of worker processes on one queue (-curve-procs, -curve-n effects,
// -payload-bytes); each process has -workers workers and the pools of the
// other scenarios.

// curveFigures are the figures of one curve point, in plotting order.
var curveFigures = []figure{
	{"effects_per_s", "drain effects/s", 0},
	{"rss_mb", "worker peak RSS MB (largest process)", 1},
	{"wal_per_effect", "WAL bytes/effect (claim+complete)", 0},
	{"cpu_pg_us", "PostgreSQL CPU µs/effect (drain)", 1},
	{"cpu_worker_us", "worker processes' CPU µs/effect", 1},
	{"insert_per_s", "pre-insert effects/s", 0},
}

// curvePoint is one measured point of one system in one round.
type curvePoint struct {
	Axis         string `json:"axis"` // backlog, payload or procs
	Backlog      int    `json:"backlog"`
	PayloadBytes int    `json:"payload_bytes"`
	Procs        int    `json:"procs"`
	System       string `json:"system"`
	Round        int    `json:"round"`
	Figures      result `json:"figures"`
	Error        string `json:"error,omitempty"`
}

// curvesFile is what -curves writes with -json, and what -plot reads.
type curvesFile struct {
	runInfo
	Systems []string     `json:"systems"`
	Points  []curvePoint `json:"points"`
}

func runCurves(ctx context.Context, o *options, admin *pgxpool.Pool, systems []system, stdout, stderr io.Writer) error {
	f := &curvesFile{runInfo: newRunInfo(ctx, admin,
		"autovacuum", "fsync", "synchronous_commit", "shared_buffers", "max_wal_size", "shared_preload_libraries")}
	for _, s := range systems {
		f.Systems = append(f.Systems, s.Name())
	}
	type key struct{ n, payload, procs int }
	var pts []curvePoint
	for _, b := range o.curveBacklogs {
		pts = append(pts, curvePoint{Axis: "backlog", Backlog: b, PayloadBytes: o.payloadBytes, Procs: 1})
	}
	for _, p := range o.curvePayloads {
		pts = append(pts, curvePoint{Axis: "payload", Backlog: o.curveN, PayloadBytes: p, Procs: 1})
	}
	for _, p := range o.curveProcs {
		pts = append(pts, curvePoint{Axis: "procs", Backlog: o.curveN, PayloadBytes: o.payloadBytes, Procs: p})
	}
	began := time.Now()
	tag := fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
	for round := 1; round <= o.rounds; round++ {
		// A point on two axes (e.g. -curve-n effects of -payload-bytes in
		// one process) is measured once per round and plotted on both.
		done := map[key]map[string]curvePoint{}
		for pi, pt := range pts {
			k := key{pt.Backlog, pt.PayloadBytes, pt.Procs}
			for si, sys := range systems {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if pt.Procs > 1 && !supports(sys, "scale") {
					// Several processes on one PgQ consumer would
					// process the same batches: no such point.
					continue
				}
				p := pt
				p.System, p.Round = sys.Name(), round
				if prev, ok := done[k][sys.Name()]; ok {
					p.Figures, p.Error = prev.Figures, prev.Error
				} else {
					t0 := time.Now()
					res, err := curvePointRun(ctx, o, admin, sys.Name(), p,
						fmt.Sprintf("pgoutbox_bench_%s_c%d_s%d_%d", tag, pi, si, round))
					p.Figures = res
					if err != nil {
						p.Error = err.Error()
						fmt.Fprintf(stderr, "round %d %-7s n=%d payload=%d procs=%d %-24s FAILED: %v\n",
							round, p.Axis, p.Backlog, p.PayloadBytes, p.Procs, p.System, err)
					} else {
						fmt.Fprintf(stderr, "round %d %-7s n=%d payload=%d procs=%d %-24s %s/s, RSS %s MB, WAL %s B, PG CPU %s µs (%.0fs)\n",
							round, p.Axis, p.Backlog, p.PayloadBytes, p.Procs, p.System, fmtNum(res["effects_per_s"], 0),
							fmtNum(res["rss_mb"], 1), fmtNum(res["wal_per_effect"], 0), fmtNum(res["cpu_pg_us"], 1), time.Since(t0).Seconds())
					}
					if done[k] == nil {
						done[k] = map[string]curvePoint{}
					}
					done[k][sys.Name()] = p
				}
				f.Points = append(f.Points, p)
			}
		}
	}
	f.finish(began)
	fmt.Fprintf(stdout, "PostgreSQL %s, %d CPUs, %s, load average before %s, after %s; %d round(s), %s\n",
		f.PostgreSQL, f.CPUs, f.Go, f.LoadBefore, f.LoadAfter, o.rounds, time.Since(began).Round(time.Second))
	fmt.Fprintf(stdout, "server settings: %s\nflags: %s\n", f.Settings, f.Flags)
	printCurves(stdout, f)
	if o.jsonOut != "" {
		if err := writeJSON(o.jsonOut, f); err != nil {
			return err
		}
	}
	if o.svgDir != "" {
		return drawCurves(f, o.svgDir)
	}
	return nil
}

// curvePointRun measures one point for one system on a fresh database.
func curvePointRun(ctx context.Context, o *options, admin *pgxpool.Pool, sysName string, p curvePoint, db string) (result, error) {
	po := *o
	po.payloadBytes = p.PayloadBytes
	sys, err := po.system(sysName)
	if err != nil {
		return nil, err
	}
	dsn, drop, err := freshDB(ctx, admin, o.dsn, db, o.keep)
	if err != nil {
		return nil, err
	}
	defer drop()
	if err := sys.Migrate(ctx, dsn); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	pool, err := benchrun.OpenPool(ctx, dsn, 2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	prod, err := benchrun.OpenPool(ctx, dsn, o.producerConns)
	if err != nil {
		return nil, err
	}
	defer prod.Close()
	e := &env{o: &po, sys: sys, db: db, dsn: dsn, pool: pool, prod: prod}
	ins, err := sys.Prepare(ctx, pool, workerConfig{workers: 1})
	if err != nil {
		return nil, err
	}
	// At most ~8 MB of payload per insert transaction.
	batch := max(1, min(o.insertBatch, (8<<20)/max(1, p.PayloadBytes)))
	t0 := time.Now()
	var inserted atomic.Int64
	stopProgress := insertProgress(p, &inserted, t0)
	err = benchrun.InsertBacklog(ctx, prod, ins, p.Backlog, batch, &inserted)
	stopProgress()
	if err != nil {
		return nil, err
	}
	res := result{"insert_per_s": float64(p.Backlog) / time.Since(t0).Seconds()}
	flushStats(prod, pool)
	lsn, err := benchrun.WALLSN(ctx, pool)
	if err != nil {
		return nil, err
	}
	pg := newPGCPU(ctx, pool)
	pg.Start()
	var pgSec, w float64
	var werr error
	d, err := drainChildren(ctx, e, p.Backlog, p.Procs, o.workers, func() {
		pgSec = pg.Since(db)
		w, werr = benchrun.WALSince(ctx, pool, lsn)
	})
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return nil, werr
	}
	n := float64(p.Backlog)
	res["effects_per_s"] = n / d.elapsed.Seconds()
	res["rss_mb"] = d.rssKB / 1024
	res["wal_per_effect"] = w / n
	res["cpu_pg_us"] = pgSec / n * 1e6
	res["cpu_worker_us"] = d.cpu / n * 1e6
	return res, nil
}

// insertProgress reports a long pre-insert (10M effects take minutes) on
// stderr every minute until the returned function is called.
func insertProgress(p curvePoint, inserted *atomic.Int64, t0 time.Time) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := inserted.Load()
				fmt.Fprintf(os.Stderr, "  %s pre-insert %s/%s effects, %s/s\n", p.System, fmtNum(float64(n), 0),
					fmtNum(float64(p.Backlog), 0), fmtNum(float64(n)/time.Since(t0).Seconds(), 0))
			}
		}
	}()
	return func() { close(done) }
}

// curveAxes are the three axes: name, x label, the x of a point.
var curveAxes = []struct {
	name, xlabel string
	x            func(curvePoint) int
}{
	{"backlog", "backlog (effects pre-inserted)", func(p curvePoint) int { return p.Backlog }},
	{"payload", "payload bytes per effect", func(p curvePoint) int { return p.PayloadBytes }},
	{"procs", "worker processes on one queue", func(p curvePoint) int { return p.Procs }},
}

// curveSeries returns, for one axis and figure, the sorted distinct x values
// and per system the median over the rounds at each x (NaN when missing).
func curveSeries(f *curvesFile, axis string, x func(curvePoint) int, key string) ([]int, map[string][]float64) {
	vals := map[string]map[int][]float64{}
	seen := map[int]bool{}
	var xs []int
	for _, p := range f.Points {
		if p.Axis != axis {
			continue
		}
		xv := x(p)
		if !seen[xv] {
			seen[xv] = true
			xs = append(xs, xv)
		}
		if p.Error != "" || p.Figures == nil {
			continue
		}
		if vals[p.System] == nil {
			vals[p.System] = map[int][]float64{}
		}
		vals[p.System][xv] = append(vals[p.System][xv], p.Figures[key])
	}
	sortInts(xs)
	out := map[string][]float64{}
	for _, s := range f.Systems {
		ys := make([]float64, len(xs))
		for i, xv := range xs {
			ys[i] = median(vals[s][xv])
		}
		out[s] = ys
	}
	return xs, out
}

func sortInts(xs []int) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && xs[j] < xs[j-1]; j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}

// printCurves prints one markdown table per axis and figure (medians).
func printCurves(w io.Writer, f *curvesFile) {
	for _, ax := range curveAxes {
		for _, fig := range curveFigures {
			xs, series := curveSeries(f, ax.name, ax.x, fig.key)
			if len(xs) == 0 {
				continue
			}
			rows := [][]string{{fig.label + " by " + ax.xlabel}}
			for _, x := range xs {
				rows[0] = append(rows[0], fmtNum(float64(x), 0))
			}
			// The backlog axis also gives its largest point as a ratio
			// to its smallest (issue 32: drain at 10M within 10 % of 100k).
			spread := ax.name == "backlog" && len(xs) > 1
			if spread {
				rows[0] = append(rows[0], fmtNum(float64(xs[len(xs)-1]), 0)+" / "+fmtNum(float64(xs[0]), 0))
			}
			for _, s := range f.Systems {
				row := []string{s}
				for _, y := range series[s] {
					row = append(row, fmtNum(y, fig.decimals))
				}
				if spread {
					row = append(row, fmtNum(lastOverFirst(series[s]), 2))
				}
				rows = append(rows, row)
			}
			fmt.Fprintln(w)
			writeMarkdown(w, rows)
		}
	}
}

// lastOverFirst is the last value of ys over its first (NaN when either is
// missing or the first is zero).
func lastOverFirst(ys []float64) float64 {
	if len(ys) < 2 {
		return math.NaN()
	}
	return ratio(ys[len(ys)-1], ys[0])
}

// plotCurves reads a curves JSON file (or a held-xmin one) and draws its
// plots into dir.
func plotCurves(path, dir string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if dir == "" {
		dir = filepath.Dir(path)
	}
	var f curvesFile
	if err := json.Unmarshal(b, &f); err != nil {
		// Or the held-xmin scenario's (-xmin -json).
		var x xminFile
		if json.Unmarshal(b, &x) != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return os.WriteFile(filepath.Join(dir, "xmin.svg"), []byte(drawXmin(&x)), 0o644)
	}
	return drawCurves(&f, dir)
}
