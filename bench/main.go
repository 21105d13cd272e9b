// Command bench runs River, PgQ (pgq.go), pgoutbox and the SQL ceilings (the
// minimal SQL lifecycles on pgoutbox's table, ceiling.go) side by side on the
// same PostgreSQL, each scenario on a fresh database, alternating the systems
// over several rounds, and prints per scenario the median and min/max of
// every figure and the ratios to River (and of each pgoutbox to PgQ, to its
// ceiling and to ceiling[delete]) pair by pair, then per effect the WAL,
// PostgreSQL CPU and top statements of every system's drain. With -curves it measures the cost curves instead (curves.go) and
// draws them as SVG (svg.go).
//
// It is its own module so that River never becomes a dependency of the
// library. Run it from the repository root:
//
//	cd bench && go run . -rounds 3
//	cd bench && go run . -rounds 1 -n 20000 -duration 5s -latency-duration 5s   # quick
//	cd bench && go run . -curves -curve-backlogs 10000,50000 -curve-n 10000 -json c.json -svg out/
//
// The admin DSN must be allowed to CREATE and DROP databases; every database
// the benchmark creates is named pgoutbox_bench_* and dropped afterwards.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

type options struct {
	dsn              string
	local            string
	rounds           int
	systems          []string
	scenarios        []string
	n                int
	insertBatch      int
	workers          int
	poolConns        int
	producerConns    int
	payloadBytes     int
	duration         time.Duration
	producers        int
	producerBatch    int
	sustainedRate    float64
	rate             float64
	latencyDuration  time.Duration
	latencyProducers int
	latencyHold      time.Duration
	scaleN           int
	scaleProcs       int
	scaleWorkers     int
	timeout          time.Duration
	keep             bool
	jsonOut          string
	cpuProfile       string
	pg               pgKnobs
	child            string
	xNoNotify        bool
	createDB         string
	ceilingLoops     int
	ceilingBatch     int
	pgqTicker        time.Duration
	statements       bool
	curves           bool
	curveBacklogs    []int
	curvePayloads    []int
	curveProcs       []int
	curveN           int
	svgDir           string
	plot             string
	pss              bool // pg_stat_statements is preloaded (set by run)
	xmin             xminOptions
}

// defaultSystems is -systems' default.
const defaultSystems = "river,pgoutbox,pgoutbox[row-lock=off],pgoutbox[storage=batch],pgq,ceiling[row-lock],ceiling,ceiling[delete]"

func defaultDSN() string {
	if v := os.Getenv("DATABASE_URL"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var systems, scens string
	fs.StringVar(&o.dsn, "dsn", defaultDSN(), "admin DSN: may create and drop databases (env DATABASE_URL)")
	fs.StringVar(&o.local, "local", "", "start (or reuse) a PostgreSQL with default settings in this directory and run there instead of -dsn (pgoutbox embedded's cluster, left running: stop it with pgoutbox --data-dir DIR embedded stop)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; each round runs every scenario for River then pgoutbox")
	fs.StringVar(&systems, "systems", defaultSystems, "systems to run, in order; ratios are to the first, and each pgoutbox's to PgQ, to the ceiling of its lease mode and to ceiling[delete] (pgoutbox alone is the engine's defaults: row-lock leases of 50 ms; row-lock=off: durable leases). pgoutbox[clients=2;claim-batch=500;completion-batch=N;poll=D;row-lock=D|off;cooldown=D;storage=rows|batch;page=N;lanes=N;work=D;handler=one|page;keys=sequential;notify=00005] is a pgoutbox variant (storage=batch: batch storage, QueueConfig.Storage, whose pages hold page=N effects, default 1,000, in lanes=N lanes, default 1; work=D: each handler waits D, a target's latency; handler=page: a PageHandler, called once per page of a batch queue, waiting D per call; it has no lease-mode ceiling, only ceiling[delete]); ceiling is the minimal SQL lifecycle on pgoutbox's table (ceiling[row-lock;loops=N;batch=N]), ceiling[delete] one DELETE … RETURNING per batch; pgq is PgQ's batch API, skipped with a note when the server lacks the extension")
	fs.StringVar(&scens, "scenarios", "drain,sustained,latency,scale", "scenarios to run")
	fs.IntVar(&o.n, "n", 100_000, "drain: effects pre-inserted")
	fs.IntVar(&o.insertBatch, "insert-batch", 5000, "effects per insert transaction for pre-inserted backlogs")
	fs.IntVar(&o.workers, "workers", 2000, "River MaxWorkers and pgoutbox Concurrency (drain, sustained, latency)")
	fs.IntVar(&o.poolConns, "pool-conns", 20, "pgxpool MaxConns of the workers' pool, both systems (0: pgxpool's default, max(4, CPUs))")
	fs.IntVar(&o.producerConns, "producer-conns", 16, "pgxpool MaxConns of the producers' (application's) pool")
	fs.IntVar(&o.payloadBytes, "payload-bytes", 300, "JSON payload size of every effect")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "sustained: how long producers enqueue")
	fs.IntVar(&o.producers, "producers", 4, "sustained: producer goroutines")
	fs.IntVar(&o.producerBatch, "producer-batch", 100, "sustained: effects per producer transaction")
	fs.Float64Var(&o.sustainedRate, "sustained-rate", 0, "sustained: effects/s all producers together insert at most (0: as fast as the database accepts)")
	fs.Float64Var(&o.rate, "rate", 1000, "latency: effects/s, one effect per transaction")
	fs.DurationVar(&o.latencyDuration, "latency-duration", 10*time.Second, "latency: how long to produce")
	fs.IntVar(&o.latencyProducers, "latency-producers", 16, "latency: concurrent producer goroutines")
	fs.DurationVar(&o.latencyHold, "latency-hold", 0, "latency: keep each producer transaction open this long after its insert, before its commit (an application's work after the enqueue)")
	fs.IntVar(&o.scaleN, "scale-n", 10_000, "scale: effects pre-inserted")
	fs.IntVar(&o.scaleProcs, "scale-procs", 2, "scale: worker processes")
	fs.IntVar(&o.scaleWorkers, "scale-workers", 4, "scale: workers per process")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up on a drain after this long")
	fs.BoolVar(&o.keep, "keep", false, "keep the databases instead of dropping them")
	fs.StringVar(&o.jsonOut, "json", "", "also write every round's raw figures to this file")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write this process's CPU profile (both systems, every scenario) to this file, for go tool pprof")
	fs.IntVar(&o.pg.claimBatch, "pg-claim-batch", 1000, "pgoutbox QueueConfig.ClaimBatch (capped at -workers)")
	fs.IntVar(&o.pg.completionBatch, "pg-completion-batch", 0, "pgoutbox Config.CompletionBatch (0: engine default)")
	fs.DurationVar(&o.pg.poll, "pg-poll", 0, "pgoutbox Config.PollInterval (0: engine default)")
	fs.DurationVar(&o.pg.rowLock, "pg-row-lock", 0, "pgoutbox QueueConfig.RowLockLease (0: the engine default, 50ms; negative: durable leases)")
	fs.DurationVar(&o.pg.claimCooldown, "pg-claim-cooldown", 0, "pgoutbox QueueConfig.ClaimCooldown (0: none)")
	fs.IntVar(&o.pg.clients, "pg-clients", 1, "pgoutbox Clients per process on the same queue (each has its own claim loop); -workers is split between them")
	fs.BoolVar(&o.xNoNotify, "x-pg-no-notify", false, "experiment: disable pgoutbox's NOTIFY-per-enqueuing-transaction trigger (workers then poll every -pg-poll)")
	fs.StringVar(&o.createDB, "create-db", "", "create (or recreate) this database with pgoutbox's migrations, print its DSN and exit (for bench/sql/lifecycle.sh)")
	fs.IntVar(&o.ceilingLoops, "ceiling-loops", 4, "ceiling: concurrent claim/complete loops (one connection each)")
	fs.IntVar(&o.ceilingBatch, "ceiling-batch", 1000, "ceiling: effects per claim")
	fs.DurationVar(&o.pgqTicker, "pgq-ticker", 100*time.Millisecond, "pgq: how often the ticker loop calls pgq.ticker() (pgqd's ticker_period is 1s); a call ticks once the queue has 500 new events or its last tick is 3s old")
	fs.BoolVar(&o.statements, "statements", true, "pg_stat_statements per statement per effect (drain): with -local, preload the extension (restarting that cluster once); with -dsn, only when the server preloads it")
	fs.BoolVar(&o.curves, "curves", false, "run the cost curves instead of the scenarios: drain rate, worker RSS, WAL and PostgreSQL CPU per effect against backlog size, payload size and worker processes (docs/benchmarks.md)")
	var backlogs, payloads, procs string
	fs.StringVar(&backlogs, "curve-backlogs", "100000,1000000,5000000", "curves: backlog sizes (effects)")
	fs.StringVar(&payloads, "curve-payloads", "300,4096,32768", "curves: payload sizes (bytes), each at -curve-n effects")
	fs.StringVar(&procs, "curve-procs", "1,2,4", "curves: worker processes on one queue, each at -curve-n effects")
	fs.IntVar(&o.curveN, "curve-n", 100000, "curves: backlog of the payload and process points")
	fs.StringVar(&o.svgDir, "svg", "", "curves: draw the plots as SVG files into this directory")
	fs.StringVar(&o.plot, "plot", "", "only draw the SVG plots (into -svg) from this curves JSON file (written by -curves -json), then exit")
	o.xmin.register(fs)
	fs.StringVar(&o.child, "child", "", "internal: run as a worker process of the scale scenario")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.systems = splitList(systems)
	o.scenarios = splitList(scens)
	var err error
	if o.curveBacklogs, err = intList(backlogs); err != nil {
		return nil, fmt.Errorf("-curve-backlogs: %w", err)
	}
	if o.curvePayloads, err = intList(payloads); err != nil {
		return nil, fmt.Errorf("-curve-payloads: %w", err)
	}
	if o.curveProcs, err = intList(procs); err != nil {
		return nil, fmt.Errorf("-curve-procs: %w", err)
	}
	if o.ceilingLoops < 1 || o.ceilingBatch < 1 || o.curveN < 1 || o.pgqTicker <= 0 {
		return nil, fmt.Errorf("-ceiling-loops, -ceiling-batch, -curve-n and -pgq-ticker must be positive")
	}
	if o.rounds < 1 || o.n < 1 || o.insertBatch < 1 || o.workers < 1 || o.producers < 1 ||
		o.producerBatch < 1 || o.sustainedRate < 0 || o.rate <= 0 || o.latencyProducers < 1 || o.scaleN < 1 ||
		o.scaleProcs < 1 || o.scaleWorkers < 1 || o.duration < 10*time.Millisecond {
		return nil, fmt.Errorf("flags must be positive")
	}
	return o, nil
}

// parseRowLock parses a row-lock knob: a duration, or "off" (durable
// leases, QueueConfig.RowLockLease negative).
func parseRowLock(v string) (time.Duration, error) {
	if v == "off" {
		return -1, nil
	}
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = fmt.Errorf("row-lock=%s: a positive duration or off", v)
	}
	return d, err
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, strings.ToLower(f))
		}
	}
	return out
}

// intList parses a comma-separated list of positive integers.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list")
	}
	return out, nil
}

func (o *options) system(name string) (system, error) {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	base, variant, _ := strings.Cut(strings.TrimSuffix(name, "]"), "[")
	switch strings.ToLower(base) {
	case "river":
		if variant == "" {
			return &riverSystem{payloadBytes: o.payloadBytes, logger: logger}, nil
		}
	case "pgoutbox":
		knobs := o.pg
		if variant != "" {
			// A variant overrides the -pg-* flags, e.g.
			// pgoutbox[clients=2;claim-batch=500;poll=20ms].
			for kv := range strings.SplitSeq(variant, ";") {
				k, v, _ := strings.Cut(kv, "=")
				var err error
				switch k {
				case "clients":
					knobs.clients, err = strconv.Atoi(v)
				case "claim-batch":
					knobs.claimBatch, err = strconv.Atoi(v)
				case "completion-batch":
					knobs.completionBatch, err = strconv.Atoi(v)
				case "poll":
					knobs.poll, err = time.ParseDuration(v)
				case "row-lock":
					knobs.rowLock, err = parseRowLock(v)
				case "cooldown":
					knobs.claimCooldown, err = time.ParseDuration(v)
				case "notify":
					if v != "00005" && v != "00011" {
						err = fmt.Errorf("notify=%q: 00005 (the old limiter) or 00011", v)
					}
					knobs.notify00005 = v == "00005"
				case "storage":
					if v != "rows" && v != "batch" {
						err = fmt.Errorf("storage=%q: rows or batch", v)
					}
					knobs.storage = pgoutbox.Storage(v)
				case "page":
					knobs.pageSize, err = strconv.Atoi(v)
					if err == nil && knobs.pageSize < 1 {
						err = fmt.Errorf("page=%s: a positive number of effects", v)
					}
				case "lanes":
					knobs.lanes, err = strconv.Atoi(v)
					if err == nil && (knobs.lanes < 1 || knobs.lanes > pgoutbox.LanesMax) {
						err = fmt.Errorf("lanes=%s: 1 to %d", v, pgoutbox.LanesMax)
					}
				case "work":
					knobs.work, err = time.ParseDuration(v)
					if err == nil && knobs.work < 0 {
						err = fmt.Errorf("work=%s: not negative", v)
					}
				case "handler":
					if v != "one" && v != "page" {
						err = fmt.Errorf("handler=%q: one or page", v)
					}
					knobs.pageHandler = v == "page"
				case "keys":
					if v != "sequential" && v != "random" {
						err = fmt.Errorf("keys=%q: sequential or random", v)
					}
					knobs.seqKeys = v == "sequential"
				default:
					err = fmt.Errorf("unknown knob %q (clients, claim-batch, completion-batch, poll, row-lock, cooldown, storage, page, lanes, work, handler, keys, notify)", k)
				}
				if err != nil {
					return nil, fmt.Errorf("system %s: %w", name, err)
				}
			}
		}
		return &pgSystem{name: name, knobs: knobs, payloadBytes: o.payloadBytes, logger: logger}, nil
	case "ceiling":
		c := &ceilingSystem{name: name, loops: o.ceilingLoops, batch: o.ceilingBatch, payloadBytes: o.payloadBytes}
		for kv := range strings.SplitSeq(variant, ";") {
			k, v, _ := strings.Cut(kv, "=")
			var err error
			switch k {
			case "":
			case "row-lock":
				c.rowLock = true
			case "delete":
				c.delete = true
			case "loops":
				c.loops, err = strconv.Atoi(v)
			case "batch":
				c.batch, err = strconv.Atoi(v)
			default:
				err = fmt.Errorf("unknown knob %q (row-lock, delete, loops, batch)", k)
			}
			if err == nil && (c.loops < 1 || c.batch < 1) {
				err = fmt.Errorf("loops and batch must be positive")
			}
			if err == nil && c.rowLock && c.delete {
				err = fmt.Errorf("row-lock and delete are two ceilings: name one")
			}
			if err != nil {
				return nil, fmt.Errorf("system %s: %w", name, err)
			}
		}
		return c, nil
	case "pgq":
		if variant == "" {
			return &pgqSystem{payloadBytes: o.payloadBytes, tickEvery: o.pgqTicker}, nil
		}
	}
	return nil, fmt.Errorf("unknown system %q (river, pgq, pgoutbox, pgoutbox[knob=value;…], ceiling, ceiling[row-lock], ceiling[delete])", name)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(2)
	}
	if o.child != "" {
		sys, err := o.system(o.child)
		if err == nil {
			err = childMain(o, sys)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt)
	defer cancel()
	if o.plot != "" {
		if err := plotCurves(o.plot, o.svgDir); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if o.createDB != "" {
		if err := createDB(ctx, o); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// rawResult is one run, for -json.
type rawResult struct {
	Round    int     `json:"round"`
	Scenario string  `json:"scenario"`
	System   string  `json:"system"`
	Figures  result  `json:"figures"`
	Seconds  float64 `json:"seconds"`
	Error    string  `json:"error,omitempty"`
}

func run(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	var systems []system
	for _, name := range o.systems {
		s, err := o.system(name)
		if err != nil {
			return err
		}
		systems = append(systems, s)
	}
	var scens []scenario
	for _, name := range o.scenarios {
		found := false
		for _, s := range scenarios {
			if s.name == name {
				scens, found = append(scens, s), true
			}
		}
		if !found {
			return fmt.Errorf("unknown scenario %q", name)
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.local != "" {
		dsn, err := ensureLocal(ctx, o.local, o.statements)
		if err != nil {
			return err
		}
		o.dsn = dsn
	}
	admin, err := benchrun.OpenPool(ctx, o.dsn, 2)
	if err != nil {
		return fmt.Errorf("admin connection: %w", err)
	}
	defer admin.Close()
	systems = availableSystems(ctx, admin, systems, stdout, stderr)
	if len(systems) == 0 {
		return errors.New("no system can run on this server")
	}
	if o.statements {
		o.pss = statementsPreloaded(ctx, admin)
		if !o.pss {
			fmt.Fprintln(stderr, "pg_stat_statements is not in shared_preload_libraries: no per-statement figures")
		}
	}
	if o.curves {
		return runCurves(ctx, o, admin, systems, stdout, stderr)
	}
	if o.xmin.on {
		return runXmin(ctx, o, admin, systems, stdout, stderr)
	}
	var version, settings string
	_ = admin.QueryRow(ctx, "SELECT current_setting('server_version')").Scan(&version)
	_ = admin.QueryRow(ctx, `SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name) FROM pg_settings
		WHERE name IN ('autovacuum', 'fsync', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'commit_delay', 'shared_preload_libraries')`).Scan(&settings)
	fmt.Fprintf(stderr, "server settings: %s\n", settings)
	fmt.Fprintf(stderr, "PostgreSQL %s, %d CPUs, %s; %d round(s)\n", version, runtime.NumCPU(), runtime.Version(), o.rounds)

	// results[scenario][system] = one result per round (nil when it failed).
	results := map[string]map[string][]result{}
	var raw []rawResult
	tag := fmt.Sprintf("%04x", rand.IntN(1<<16))
	began := time.Now()
	load0 := loadAvg()
	for round := 1; round <= o.rounds; round++ {
		for _, sc := range scens {
			for si, sys := range systems {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if !supports(sys, sc.name) {
					continue
				}
				t0 := time.Now()
				res, err := runOne(ctx, o, admin, sc, sys, fmt.Sprintf("pgoutbox_bench_%s_s%d_%s_%d",
					tag, si, sc.name, round))
				rr := rawResult{Round: round, Scenario: sc.name, System: sys.Name(), Figures: res, Seconds: time.Since(t0).Seconds()}
				if err != nil {
					rr.Error = err.Error()
					fmt.Fprintf(stderr, "round %d %-9s %-8s FAILED: %v\n", round, sc.name, sys.Name(), err)
				} else {
					fmt.Fprintf(stderr, "round %d %-9s %-8s %s (%.0fs)\n", round, sc.name, sys.Name(), summary(sc, res), rr.Seconds)
				}
				raw = append(raw, rr)
				if results[sc.name] == nil {
					results[sc.name] = map[string][]result{}
				}
				results[sc.name][sys.Name()] = append(results[sc.name][sys.Name()], res)
			}
		}
	}
	fmt.Fprintf(stderr, "total %s\n", time.Since(began).Round(time.Second))
	fmt.Fprintf(stdout, "PostgreSQL %s, %d CPUs, %s, load average before %s, after %s; %d round(s), %s\n",
		version, runtime.NumCPU(), runtime.Version(), load0, loadAvg(), o.rounds, time.Since(began).Round(time.Second))
	fmt.Fprintf(stdout, "server settings: %s\n", settings)
	fmt.Fprintf(stdout, "flags: %s\n", recordedFlags())
	fmt.Fprintf(stdout, "pgoutbox: Concurrency %d, ClaimBatch %d, Clients %d, CompletionBatch %s, PollInterval %s; pools: workers %d, producers %d conns\n",
		o.workers, min(o.pg.claimBatch, o.workers), max(1, o.pg.clients), orDefault(o.pg.completionBatch), orDefault(o.pg.poll), o.poolConns, o.producerConns)
	printTable(stdout, scens, systems, results)
	printRatios(stdout, systems, results)
	printExplain(stdout, systems, results, o.pss)
	printStatements(stdout, systems, results)
	if o.jsonOut != "" {
		b, err := json.MarshalIndent(raw, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func runOne(ctx context.Context, o *options, admin *pgxpool.Pool, sc scenario, sys system, db string) (result, error) {
	dsn, drop, err := freshDB(ctx, admin, o.dsn, db, o.keep)
	if err != nil {
		return nil, err
	}
	defer drop()
	if err := sys.Migrate(ctx, dsn); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	pool, err := benchrun.OpenPool(ctx, dsn, o.poolConns)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, ok := sys.(*pgSystem); ok && o.xNoNotify {
		if _, err := pool.Exec(ctx, "ALTER TABLE pgoutbox.effects DISABLE TRIGGER effects_notify_insert"); err != nil {
			return nil, err
		}
	}
	prod, err := benchrun.OpenPool(ctx, dsn, o.producerConns)
	if err != nil {
		return nil, err
	}
	defer prod.Close()
	if o.pss {
		if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return nil, err
		}
	}
	return sc.run(ctx, &env{o: o, sys: sys, db: db, dsn: dsn, pool: pool, prod: prod})
}

func summary(sc scenario, r result) string {
	var parts []string
	for _, f := range sc.figures[:min(3, len(sc.figures))] {
		parts = append(parts, fmt.Sprintf("%s=%s", f.key, fmtNum(r[f.key], f.decimals)))
	}
	return strings.Join(parts, " ")
}

func fmtNum(v float64, decimals int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	s := fmt.Sprintf("%.*f", decimals, v)
	// Thousands separators for the integer part.
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	out := b.String()
	if frac != "" {
		out += "." + frac
	}
	if neg {
		out = "-" + out
	}
	return out
}

func stat(xs []float64, decimals int) string {
	m := median(xs)
	lo, hi := minMax(xs)
	if math.IsNaN(m) {
		return "n/a"
	}
	if len(xs) == 1 || lo == hi {
		return fmtNum(m, decimals)
	}
	return fmt.Sprintf("%s [%s – %s]", fmtNum(m, decimals), fmtNum(lo, decimals), fmtNum(hi, decimals))
}

// printTable prints one markdown table per scenario.
func printTable(w io.Writer, scens []scenario, systems []system, results map[string]map[string][]result) {
	for _, sc := range scens {
		var names []string
		for _, s := range systems {
			if supports(s, sc.name) {
				names = append(names, s.Name())
			}
		}
		if len(names) == 0 {
			continue
		}
		header := []string{sc.name}
		for _, n := range names {
			header = append(header, n+" median [min – max]")
		}
		for _, n := range names[1:] {
			header = append(header, n+" / "+names[0]+" median [min – max]")
		}
		rows := [][]string{header}
		for _, f := range sc.figures {
			row := []string{f.label}
			series := map[string][]float64{}
			for _, n := range names {
				for _, r := range results[sc.name][n] {
					v := math.NaN()
					if x, ok := r[f.key]; ok && r != nil {
						v = x
					}
					series[n] = append(series[n], v)
				}
				row = append(row, stat(series[n], f.decimals))
			}
			// Ratios pair by pair: round i of each system to round i of
			// the first, which ran just before it.
			for _, n := range names[1:] {
				var ratios []float64
				a, b := series[names[0]], series[n]
				for i := range min(len(a), len(b)) {
					ratio := math.NaN()
					if a[i] != 0 {
						ratio = b[i] / a[i]
					}
					ratios = append(ratios, ratio)
				}
				row = append(row, stat(ratios, 2))
			}
			rows = append(rows, row)
		}
		fmt.Fprintln(w)
		writeMarkdown(w, rows)
	}
}

func writeMarkdown(w io.Writer, rows [][]string) {
	width := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, c := range cells {
			pad := width[i] - utf8.RuneCountInString(c)
			if i == 0 {
				fmt.Fprintf(&b, "| %s%s ", c, strings.Repeat(" ", pad))
			} else {
				fmt.Fprintf(&b, "| %s%s ", strings.Repeat(" ", pad), c)
			}
		}
		b.WriteString("|")
		fmt.Fprintln(w, b.String())
	}
	line(rows[0])
	sep := make([]string, len(width))
	for i, n := range width {
		if i == 0 {
			sep[i] = strings.Repeat("-", n)
		} else {
			sep[i] = strings.Repeat("-", n-1) + ":"
		}
	}
	line(sep)
	for _, r := range rows[1:] {
		line(r)
	}
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}

func orDefault[T comparable](v T) string {
	var zero T
	if v == zero {
		return "default"
	}
	return fmt.Sprint(v)
}

// createDB makes a fresh database with pgoutbox's schema and prints its DSN.
func createDB(ctx context.Context, o *options) error {
	if !strings.HasPrefix(o.createDB, "pgoutbox_bench") {
		return fmt.Errorf("-create-db: the name must start with pgoutbox_bench")
	}
	admin, err := benchrun.OpenPool(ctx, o.dsn, 1)
	if err != nil {
		return err
	}
	defer admin.Close()
	dsn, _, err := freshDB(ctx, admin, o.dsn, o.createDB, true)
	if err != nil {
		return err
	}
	if err := (&pgSystem{}).Migrate(ctx, dsn); err != nil {
		return err
	}
	fmt.Println(dsn)
	return nil
}

// recordedFlags is this run's flags as the printed output and the JSON
// record them: absolute paths inside the repository (make passes -local
// as one) are made relative to the bench directory, so committed results
// name no path of the machine that produced them.
func recordedFlags() string {
	root := ""
	if wd, err := os.Getwd(); err == nil {
		root = filepath.Dir(wd) + string(filepath.Separator)
	}
	args := make([]string, len(os.Args)-1)
	for i, a := range os.Args[1:] {
		if root != string(filepath.Separator) && strings.HasPrefix(a, root) {
			a = filepath.Join("..", strings.TrimPrefix(a, root))
		}
		args[i] = a
	}
	return strings.Join(args, " ")
}
