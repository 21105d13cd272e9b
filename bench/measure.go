package main

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// dsnWithDB returns dsn pointed at database db.
func dsnWithDB(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", err
		}
		u.Path = "/" + db
		return u.String(), nil
	}
	return dsn + " dbname=" + db, nil
}

// freshDB creates an empty database and returns its DSN and a drop function.
func freshDB(ctx context.Context, admin *pgxpool.Pool, adminDSN, name string, keep bool) (string, func(), error) {
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return "", nil, err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	dsn, err := dsnWithDB(adminDSN, name)
	if err != nil {
		return "", nil, err
	}
	drop := func() {
		if keep {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
	}
	return dsn, drop, nil
}

// relSize is the total size (heap, indexes, TOAST) of tables, in bytes.
func relSize(ctx context.Context, pool *pgxpool.Pool, tables []string) (float64, error) {
	var b int64
	err := pool.QueryRow(ctx, "SELECT sum(pg_total_relation_size(t::regclass))::bigint FROM unnest($1::text[]) t", tables).Scan(&b)
	return float64(b), err
}

// claimPercentiles returns p50 and p99 in ms of claimed - available over
// the rows sql selects (id, available, claimed) with ids above afterID; NaN
// when sql is empty (the system records no claim time).
func claimPercentiles(ctx context.Context, pool *pgxpool.Pool, sql string, afterID int64) (p50, p99 float64, err error) {
	if sql == "" {
		return math.NaN(), math.NaN(), nil
	}
	q := `SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
	             coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0)
	      FROM (SELECT extract(epoch FROM c - a) * 1000 AS ms FROM (` + sql + `) AS x(id, a, c) WHERE id > $1) AS y`
	err = pool.QueryRow(ctx, q, afterID).Scan(&p50, &p99)
	return p50, p99, err
}

// claimSpans splits the claim latency of the latency scenario's effects
// (ids above l.WarmMaxID) at their commit: available → commit is the
// producer's transaction (available_at is its start: the insert's now()),
// commit → claimed is the queue's own part. The commit is when the
// producer's InsertOne returned, on this process's clock, moved to the
// database clock by an offset measured with clock_timestamp() (a round
// trip's half, well under a millisecond on one host). It returns the p50
// and p99 of each span in ms; NaN when sql is empty.
func claimSpans(ctx context.Context, pool *pgxpool.Pool, sql string, l benchrun.LatencyResult) (prod, queue [2]float64, err error) {
	if sql == "" {
		nan := [2]float64{math.NaN(), math.NaN()}
		return nan, nan, nil
	}
	var db time.Time
	t0 := time.Now()
	if err = pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
		return prod, queue, err
	}
	t1 := time.Now()
	offset := db.Sub(t0.Add(t1.Sub(t0) / 2)) // database clock - this clock
	rows, err := pool.Query(ctx, `SELECT id, a, c FROM (`+sql+`) AS x(id, a, c) WHERE id > $1`, l.WarmMaxID)
	if err != nil {
		return prod, queue, err
	}
	var ps, qs []float64
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	for rows.Next() {
		var id int64
		var a, c time.Time
		if err := rows.Scan(&id, &a, &c); err != nil {
			return prod, queue, err
		}
		if commit, ok := l.Commits.Get(id); ok {
			commit = commit.Add(offset)
			ps, qs = append(ps, ms(commit.Sub(a))), append(qs, ms(c.Sub(commit)))
		}
	}
	if err := rows.Err(); err != nil {
		return prod, queue, err
	}
	slices.Sort(ps)
	slices.Sort(qs)
	prod = [2]float64{benchrun.Percentile(ps, 0.5), benchrun.Percentile(ps, 0.99)}
	queue = [2]float64{benchrun.Percentile(qs, 0.5), benchrun.Percentile(qs, 0.99)}
	return prod, queue, nil
}

// pgCPU samples the CPU time of the PostgreSQL server's processes from /proc
// (the server must run on this machine; otherwise the figure is NaN).
type pgCPU struct {
	postmaster int
	start      map[int]int64 // pid -> clock ticks
}

const clockTicks = 100 // USER_HZ on Linux

func newPGCPU(ctx context.Context, pool *pgxpool.Pool) *pgCPU {
	var dir string
	if err := pool.QueryRow(ctx, "SELECT current_setting('data_directory')").Scan(&dir); err != nil {
		return &pgCPU{}
	}
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return &pgCPU{}
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return &pgCPU{postmaster: pid}
}

// procStat returns ppid and utime+stime ticks of pid.
func procStat(pid int) (ppid int, ticks int64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, ut + st, true
}

// children maps each process of the server (postmaster's children) to its
// CPU ticks, keeping those whose command line satisfies keep.
func (p *pgCPU) children(keep func(cmd string) bool) map[int]int64 {
	out := map[int]int64{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, ticks, ok := procStat(pid)
		if !ok || ppid != p.postmaster {
			continue
		}
		if keep != nil {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if !keep(string(cmd)) {
				continue
			}
		}
		out[pid] = ticks
	}
	return out
}

func (p *pgCPU) Start() {
	if p.postmaster == 0 {
		return
	}
	p.start = p.children(nil)
}

// Since returns the CPU seconds used since Start by the backends connected
// to database db plus the server's shared background processes (WAL writer,
// checkpointer, background writer, autovacuum).
func (p *pgCPU) Since(db string) float64 {
	if p.postmaster == 0 || p.start == nil {
		return math.NaN()
	}
	keep := func(cmd string) bool {
		return strings.Contains(cmd, " "+db+" ") || strings.Contains(cmd, "walwriter") ||
			strings.Contains(cmd, "checkpointer") || strings.Contains(cmd, "background writer") ||
			strings.Contains(cmd, "autovacuum")
	}
	var ticks int64
	for pid, t := range p.children(keep) {
		ticks += t - p.start[pid]
	}
	return float64(ticks) / clockTicks
}

func median(xs []float64) float64 {
	ys := slices.Clone(xs)
	ys = slices.DeleteFunc(ys, math.IsNaN)
	if len(ys) == 0 {
		return math.NaN()
	}
	slices.Sort(ys)
	n := len(ys)
	if n%2 == 1 {
		return ys[n/2]
	}
	return (ys[n/2-1] + ys[n/2]) / 2
}

func minMax(xs []float64) (lo, hi float64) {
	lo, hi = math.NaN(), math.NaN()
	for _, x := range xs {
		if math.IsNaN(x) {
			continue
		}
		if math.IsNaN(lo) || x < lo {
			lo = x
		}
		if math.IsNaN(hi) || x > hi {
			hi = x
		}
	}
	return lo, hi
}

// dbStats are cumulative statistics counters of the benchmark database and
// its table. PostgreSQL flushes a backend's counters at most once a second
// and when it exits, so callers reset their pools before reading.
type dbStats struct {
	xacts, updates, hotUpdates, deletes float64
}

func readStats(ctx context.Context, pool *pgxpool.Pool, table string) (dbStats, error) {
	var s dbStats
	err := pool.QueryRow(ctx, `
		SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database())::float8,
		       coalesce(n_tup_upd, 0)::float8, coalesce(n_tup_hot_upd, 0)::float8, coalesce(n_tup_del, 0)::float8
		FROM pg_stat_user_tables WHERE relid = $1::regclass`, table).Scan(&s.xacts, &s.updates, &s.hotUpdates, &s.deletes)
	return s, err
}

// flushStats closes every connection of the pools so that their backends
// report their statistics, then waits for them to exit.
func flushStats(pools ...*pgxpool.Pool) {
	for _, p := range pools {
		p.Reset()
	}
	time.Sleep(300 * time.Millisecond)
}
