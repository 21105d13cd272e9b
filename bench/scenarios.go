package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// result is one scenario's figures for one system in one round.
type result map[string]float64

// figure describes one reported number.
type figure struct {
	key, label string
	decimals   int
}

// scenario is one workload run on a fresh database.
type scenario struct {
	name    string
	figures []figure
	run     func(ctx context.Context, e *env) (result, error)
}

// env is what a scenario run gets: a fresh, migrated database.
type env struct {
	o    *options
	sys  system
	db   string // database name
	dsn  string
	pool *pgxpool.Pool // the workers' pool (the system's client)
	prod *pgxpool.Pool // the producers' pool (the application)
}

var scenarios = []scenario{
	{
		name: "drain",
		figures: []figure{
			{"effects_per_s", "drain effects/s", 0},
			{"insert_per_s", "pre-insert effects/s (batches of -insert-batch)", 0},
			{"wal_insert", "WAL bytes/effect, insert", 0},
			{"wal_drain", "WAL bytes/effect, claim+complete", 0},
			{"xacts", "transactions per 1,000 effects (claim+complete)", 1},
			{"updates", "row updates per effect (claim+complete)", 2},
			{"hot", "HOT updates, % of row updates", 1},
			{"cpu_proc", "CPU s/10k effects, bench process (drain)", 2},
			{"cpu_pg", "CPU s/10k effects, PostgreSQL (drain)", 2},
			{"stmt_total", "statement execution µs/effect, pg_stat_statements (drain)", 1},
			{"size_empty", "table+indexes MB, empty", 2},
			{"size_drained", "table+indexes MB, after drain", 2},
			{"size_retained", "table+indexes MB, after retention + VACUUM", 2},
			{"size_retained2", "table+indexes MB, after a second drain + retention + VACUUM", 2},
			{"size_compacted", "table+indexes MB, then VACUUM + REINDEX TABLE CONCURRENTLY (pgoutbox compact)", 2},
		},
		run: runDrain,
	},
	{
		name: "sustained",
		figures: []figure{
			{"completed_per_s", "completed effects/s", 0},
			{"inserted_per_s", "inserted effects/s", 0},
			{"backlog", "backlog at end (inserted - completed)", 0},
			{"claim_p99", "claim latency p99 ms (available -> claimed)", 1},
			{"last_first", "throughput last 10% / first 10% of run", 2},
			{"wal_per_effect", "WAL bytes per completed effect", 0},
		},
		run: runSustained,
	},
	{
		name: "latency",
		figures: []figure{
			{"rate", "achieved enqueue rate/s", 0},
			{"start_p50", "commit -> delivery start p50 ms", 2},
			{"start_p99", "commit -> delivery start p99 ms", 2},
			{"claim_p50", "claim latency p50 ms (available -> claimed)", 2},
			{"claim_p99", "claim latency p99 ms (available -> claimed)", 2},
			{"commit_claim_p50", "commit -> claimed p50 ms (the queue's part)", 2},
			{"commit_claim_p99", "commit -> claimed p99 ms (the queue's part)", 2},
			{"producer_tx_p50", "available -> commit p50 ms (the producer's transaction)", 2},
			{"producer_tx_p99", "available -> commit p99 ms (the producer's transaction)", 2},
		},
		run: runLatency,
	},
	{
		name: "scale",
		figures: []figure{
			{"effects_per_s", "drain effects/s, -scale-procs processes x -scale-workers workers", 0},
			{"xacts", "transactions per 1,000 effects (claim+complete)", 1},
			{"cpu_proc", "CPU s/10k effects, worker processes", 2},
		},
		run: runScale,
	},
}

func runDrain(ctx context.Context, e *env) (result, error) {
	n := e.o.n
	res := result{}
	var err error
	if res["size_empty"], err = relSize(ctx, e.pool, e.sys.Tables()); err != nil {
		return nil, err
	}
	r, err := e.sys.Prepare(ctx, e.pool, workerConfig{workers: e.o.workers})
	if err != nil {
		return nil, err
	}
	var st0 dbStats
	var pg *pgCPU
	var pgSec float64
	d, err := benchrun.Drain(ctx, e.pool, e.prod, r, benchrun.DrainConfig{
		Effects: n, InsertBatch: e.o.insertBatch, Timeout: e.o.timeout,
		BeforeStart: func(ctx context.Context) error {
			flushStats(e.prod, e.pool)
			var err error
			if st0, err = readStats(ctx, e.pool, e.sys.Tables()[0]); err != nil {
				return err
			}
			if e.o.pss {
				if err := resetStatements(ctx, e.pool); err != nil {
					return err
				}
			}
			pg = newPGCPU(ctx, e.pool)
			pg.Start()
			return nil
		},
		Drained: func() { pgSec = pg.Since(e.db) },
	})
	if err != nil {
		return nil, err
	}
	res["insert_per_s"] = float64(n) / d.Insert.Seconds()
	res["wal_insert"] = d.WALInsert / float64(n)
	elapsed, cpu := d.Elapsed, d.CPU
	w := d.WALDrain
	res["stmt_total"] = math.NaN()
	if e.o.pss {
		if err := readStatements(ctx, e.pool, n, res); err != nil {
			return nil, err
		}
	}
	res["effects_per_s"] = float64(n) / elapsed.Seconds()
	res["wal_drain"] = w / float64(n)
	res["cpu_proc"] = cpu.Seconds() / float64(n) * 10000
	res["cpu_pg"] = pgSec / float64(n) * 10000
	flushStats(e.pool)
	st1, err := readStats(ctx, e.prod, e.sys.Tables()[0])
	if err != nil {
		return nil, err
	}
	res["xacts"] = (st1.xacts - st0.xacts) / float64(n) * 1000
	res["updates"] = (st1.updates - st0.updates) / float64(n)
	res["hot"] = math.NaN()
	if d := st1.updates - st0.updates; d > 0 {
		res["hot"] = (st1.hotUpdates - st0.hotUpdates) / d * 100
	}

	if res["size_drained"], err = relSize(ctx, e.pool, e.sys.Tables()); err != nil {
		return nil, err
	}
	if err := retain(ctx, e); err != nil {
		return nil, err
	}
	if res["size_retained"], err = relSize(ctx, e.pool, e.sys.Tables()); err != nil {
		return nil, err
	}
	// A second cycle on the same table: steady state means the space the
	// first one freed is reused, not added to.
	if err := drainCycle(ctx, e, n); err != nil {
		return nil, fmt.Errorf("second cycle: %w", err)
	}
	if res["size_retained2"], err = relSize(ctx, e.pool, e.sys.Tables()); err != nil {
		return nil, err
	}
	// What `pgoutbox compact` does, applied to each system's tables alike.
	for _, t := range e.sys.Tables() {
		for _, stmt := range []string{"VACUUM " + t, "REINDEX TABLE CONCURRENTLY " + t} {
			if _, err := e.pool.Exec(ctx, stmt); err != nil {
				return nil, fmt.Errorf("%s: %w", stmt, err)
			}
		}
	}
	if res["size_compacted"], err = relSize(ctx, e.pool, e.sys.Tables()); err != nil {
		return nil, err
	}
	for _, k := range []string{"size_empty", "size_drained", "size_retained", "size_retained2", "size_compacted"} {
		res[k] /= 1 << 20
	}
	return res, nil
}

// drainCycle inserts n effects, drains them, applies retention and VACUUMs.
func drainCycle(ctx context.Context, e *env, n int) error {
	r, err := e.sys.Prepare(ctx, e.pool, workerConfig{workers: e.o.workers})
	if err != nil {
		return err
	}
	if _, err := benchrun.Drain(ctx, e.pool, e.prod, r, benchrun.DrainConfig{
		Effects: n, InsertBatch: e.o.insertBatch, Timeout: e.o.timeout,
	}); err != nil {
		return err
	}
	return retain(ctx, e)
}

// retain deletes every completed effect (the system's own retention) and
// VACUUMs its tables.
func retain(ctx context.Context, e *env) error {
	if _, err := e.sys.Retention(ctx, e.pool); err != nil {
		return fmt.Errorf("retention: %w", err)
	}
	_, err := e.pool.Exec(ctx, "VACUUM "+strings.Join(e.sys.Tables(), ", "))
	return err
}

func runSustained(ctx context.Context, e *env) (result, error) {
	r, err := e.sys.Prepare(ctx, e.pool, workerConfig{workers: e.o.workers})
	if err != nil {
		return nil, err
	}
	lsn, err := benchrun.WALLSN(ctx, e.pool)
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), benchrun.StopTimeout)
		_ = r.Stop(stopCtx)
		cancel()
	}()

	d := e.o.duration
	sr, err := benchrun.Sustained(ctx, e.prod, r, benchrun.SustainedConfig{
		Duration: d, Producers: e.o.producers, ProducerBatch: e.o.producerBatch, Rate: e.o.sustainedRate,
	})
	if err != nil {
		return nil, err
	}
	seg := d / 10
	marks, imarks := sr.CompletedMarks, sr.InsertedMarks
	elapsed, completed, ins := sr.Elapsed, sr.Completed, sr.Inserted
	w, err := benchrun.WALSince(ctx, e.pool, lsn)
	if err != nil {
		return nil, err
	}
	_, p99, err := claimPercentiles(ctx, e.pool, e.sys.ClaimLatencySQL(), 0)
	if err != nil {
		return nil, err
	}
	first, last := marks[1]-marks[0], marks[10]-marks[9]
	res := result{
		"completed_per_s": float64(completed) / elapsed.Seconds(),
		"inserted_per_s":  float64(ins) / elapsed.Seconds(),
		"backlog":         float64(ins - completed),
		"claim_p99":       p99,
		"last_first":      math.NaN(),
		"wal_per_effect":  math.NaN(),
	}
	if first > 0 {
		res["last_first"] = float64(last) / float64(first)
	}
	// The rate of every tenth, for the JSON output (-json): when a long run
	// degrades, this shows when.
	for i := 1; i <= 10; i++ {
		res[fmt.Sprintf("completed_per_s_tenth_%02d", i)] = float64(marks[i]-marks[i-1]) / seg.Seconds()
		res[fmt.Sprintf("inserted_per_s_tenth_%02d", i)] = float64(imarks[i]-imarks[i-1]) / seg.Seconds()
	}
	if completed > 0 {
		// Includes the WAL of inserting the effects still in the backlog.
		res["wal_per_effect"] = w / float64(completed)
	}
	return res, nil
}

func runLatency(ctx context.Context, e *env) (result, error) {
	starts := benchrun.NewStamps()
	r, err := e.sys.Prepare(ctx, e.pool, workerConfig{
		workers: e.o.workers,
		onWork:  func(id int64) { starts.Set(id, time.Now(), true) },
	})
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), benchrun.StopTimeout)
		_ = r.Stop(stopCtx)
		cancel()
	}()
	l, err := benchrun.Latency(ctx, e.prod, r, starts, benchrun.LatencyConfig{
		Rate: e.o.rate, Duration: e.o.latencyDuration, Producers: e.o.latencyProducers,
		Settle: time.Second, Wait: 30 * time.Second, // let the client settle (leader election, LISTEN)
		WarmUp: 2 * time.Second,
		Hold:   e.o.latencyHold,
	})
	if err != nil {
		return nil, err
	}
	if !l.Completed {
		return nil, fmt.Errorf("latency: %d of %d completed 30s after the last enqueue; not completed: %s",
			r.Completed().Load()-l.Warm, l.Produced, diagnose(ctx, e, starts))
	}
	p50, p99, err := claimPercentiles(ctx, e.pool, e.sys.ClaimLatencySQL(), l.WarmMaxID)
	if err != nil {
		return nil, err
	}
	prod, queue, err := claimSpans(ctx, e.pool, e.sys.ClaimLatencySQL(), l)
	if err != nil {
		return nil, err
	}
	return result{
		"rate":             float64(l.Produced) / l.Elapsed.Seconds(),
		"start_p50":        benchrun.Percentile(l.StartMs, 0.50),
		"start_p99":        benchrun.Percentile(l.StartMs, 0.99),
		"claim_p50":        p50,
		"claim_p99":        p99,
		"commit_claim_p50": queue[0],
		"commit_claim_p99": queue[1],
		"producer_tx_p50":  prod[0],
		"producer_tx_p99":  prod[1],
	}, nil
}

// diagnose describes the rows that did not complete, and whether their
// handler ran.
func diagnose(ctx context.Context, e *env, starts *benchrun.Stamps) string {
	rows, err := e.pool.Query(ctx, e.sys.DiagnoseSQL())
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id int64
		var state, claimed, expires, lastErr string
		var attempts int
		if err := rows.Scan(&id, &state, &attempts, &claimed, &expires, &lastErr); err != nil {
			return err.Error()
		}
		_, started := starts.Get(id)
		out = append(out, fmt.Sprintf("id=%d state=%s attempts=%d claimed=%s expires=%s handler_started=%v err=%q",
			id, state, attempts, claimed, expires, started, lastErr))
	}
	return strings.Join(out, "; ")
}
