package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

// supports reports whether sys runs in scenario (every system runs every
// scenario unless it says otherwise).
func supports(sys system, scenario string) bool {
	if s, ok := sys.(interface{ supports(string) bool }); ok {
		return s.supports(scenario)
	}
	return true
}

// availableSystems drops the systems the server cannot run (a system that
// has an available method, PgQ: its extension is missing), printing why on
// stdout and stderr, so that the rest of the benchmark runs.
func availableSystems(ctx context.Context, admin *pgxpool.Pool, systems []system, stdout, stderr io.Writer) []system {
	var out []system
	for _, s := range systems {
		if a, ok := s.(interface {
			available(context.Context, *pgxpool.Pool) error
		}); ok {
			if err := a.available(ctx, admin); err != nil {
				for _, w := range []io.Writer{stdout, stderr} {
					fmt.Fprintf(w, "%s skipped: %v\n", s.Name(), err)
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// ensureLocal starts (or reuses) the benchmark's own cluster in dir. With
// statements, it also makes that cluster preload pg_stat_statements (ALTER
// SYSTEM, then one restart), when the extension is installed; the cluster is
// the benchmark's, so nothing else is affected.
func ensureLocal(ctx context.Context, dir string, statements bool) (string, error) {
	dsn, err := embedded.EnsureLocal(ctx, dir, nil)
	if err != nil || !statements {
		return dsn, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	var preload string
	var available bool
	err = conn.QueryRow(ctx, `SELECT current_setting('shared_preload_libraries'),
		EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pg_stat_statements')`).Scan(&preload, &available)
	if err != nil || !available || strings.Contains(preload, "pg_stat_statements") {
		conn.Close(ctx)
		return dsn, err
	}
	libs := "pg_stat_statements"
	if strings.TrimSpace(preload) != "" {
		libs = preload + "," + libs
	}
	_, err = conn.Exec(ctx, "ALTER SYSTEM SET shared_preload_libraries = "+quoteLiteral(libs))
	conn.Close(ctx)
	if err != nil {
		return "", fmt.Errorf("preload pg_stat_statements: %w", err)
	}
	if err := embedded.StopLocal(dir); err != nil {
		return "", fmt.Errorf("restart for pg_stat_statements: %w", err)
	}
	return embedded.EnsureLocal(ctx, dir, nil)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// statementsPreloaded reports whether the server preloads pg_stat_statements
// (the extension is then created in each benchmark database).
func statementsPreloaded(ctx context.Context, pool *pgxpool.Pool) bool {
	var preload string
	if err := pool.QueryRow(ctx, "SELECT current_setting('shared_preload_libraries')").Scan(&preload); err != nil {
		return false
	}
	return strings.Contains(preload, "pg_stat_statements")
}

// resetStatements clears pg_stat_statements for the current database.
func resetStatements(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database WHERE datname = current_database()), 0)`)
	return err
}

// readStatements adds to res, per statement of the current database since
// resetStatements, "stmt_us:<statement>" (execution µs per effect, wall
// time: lock and CPU waits included) and "stmt_calls:<statement>" (calls per
// 1,000 effects), and "stmt_total" (the sum of the µs). The benchmark's own
// measurement queries are left out.
func readStatements(ctx context.Context, pool *pgxpool.Pool, n int, res result) error {
	rows, err := pool.Query(ctx, `SELECT query, calls, total_exec_time FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return err
	}
	defer rows.Close()
	total := 0.0
	for rows.Next() {
		var q string
		var calls int64
		var ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			return err
		}
		if strings.Contains(q, "pg_stat_") || strings.Contains(q, "pg_current_wal_lsn") ||
			strings.Contains(q, "pg_wal_lsn_diff") || strings.Contains(q, "pg_database") {
			continue
		}
		label := strings.Join(strings.Fields(q), " ")
		if len(label) > 90 {
			label = label[:90] + "…"
		}
		us := ms * 1000 / float64(n)
		res["stmt_us:"+label] += us
		res["stmt_calls:"+label] += float64(calls) / float64(n) * 1000
		total += us
	}
	res["stmt_total"] = total
	return rows.Err()
}

// ceilingFor is the ceiling system of sys's lease mode among systems, or nil.
// Batch storage has none: its lease is one row per batch, not per effect,
// and a success writes nothing, so no row lifecycle is its limit; it is
// measured against ceiling[delete] (see ratioNotes).
func ceilingFor(sys system, systems []system) system {
	p, ok := sys.(*pgSystem)
	if !ok || p.batch() {
		return nil
	}
	for _, s := range systems {
		if c, ok := s.(*ceilingSystem); ok && !c.delete && c.rowLock == (p.knobs.rowLock >= 0) {
			return c
		}
	}
	return nil
}

// ratioPairs lists the headline ratios as {reference, system} pairs: every
// system over the first (River by default); then every pgoutbox system over
// PgQ, over the ceiling of its lease mode (none for batch storage) and over
// ceiling[delete], each when it runs. A pair is listed once.
func ratioPairs(systems []system) [][2]system {
	var pairs [][2]system
	seen := map[[2]string]bool{}
	add := func(ref, s system) {
		if ref == nil || ref == s {
			return
		}
		k := [2]string{ref.Name(), s.Name()}
		if !seen[k] {
			seen[k] = true
			pairs = append(pairs, [2]system{ref, s})
		}
	}
	if len(systems) == 0 {
		return nil
	}
	for _, s := range systems[1:] {
		add(systems[0], s)
	}
	var pgq, del system
	for _, s := range systems {
		switch c := s.(type) {
		case *pgqSystem:
			pgq = c
		case *ceilingSystem:
			if c.delete && del == nil {
				del = c
			}
		}
	}
	for _, s := range systems {
		if _, ok := s.(*pgSystem); !ok {
			continue
		}
		if pgq != nil {
			add(pgq, s)
		}
		if c := ceilingFor(s, systems); c != nil {
			add(c, s)
		}
		if del != nil {
			add(del, s)
		}
	}
	return pairs
}

// ratioNotes explains the pairs ratioPairs leaves out: a batch-storage
// pgoutbox has no lease-mode ceiling, only ceiling[delete] when it runs.
func ratioNotes(systems []system) []string {
	del := ""
	for _, s := range systems {
		if c, ok := s.(*ceilingSystem); ok && c.delete {
			del = c.Name()
			break
		}
	}
	var notes []string
	for _, s := range systems {
		if p, ok := s.(*pgSystem); ok && p.batch() {
			n := p.Name() + " has no ceiling of its own lease mode (a batch lease is one row per batch, and a success writes no row)"
			if del != "" {
				n += ": its ceiling ratio is to " + del
			} else {
				n += "; run ceiling[delete] for its ceiling ratio"
			}
			notes = append(notes, n+".")
		}
	}
	return notes
}

// pairRatios is b/a round by round.
func pairRatios(a, b []result, key string) []float64 {
	var out []float64
	for i := range min(len(a), len(b)) {
		v := math.NaN()
		if a[i] != nil && b[i] != nil && a[i][key] != 0 {
			v = b[i][key] / a[i][key]
		}
		out = append(out, v)
	}
	return out
}

// printRatios prints the headline table: drain and sustained throughput of
// the pairs of ratioPairs.
func printRatios(w io.Writer, systems []system, results map[string]map[string][]result) {
	cols := []struct{ scenario, key, label string }{
		{"drain", "effects_per_s", "drain effects/s"},
		{"sustained", "completed_per_s", "sustained completed effects/s"},
	}
	pairs := ratioPairs(systems)
	if len(pairs) == 0 {
		return
	}
	rows := [][]string{{"ratio, median [min – max] of the rounds' pairs"}}
	for _, c := range cols {
		rows[0] = append(rows[0], c.label)
	}
	any := false
	for _, p := range pairs {
		row := []string{p[1].Name() + " / " + p[0].Name()}
		for _, c := range cols {
			rs := pairRatios(results[c.scenario][p[0].Name()], results[c.scenario][p[1].Name()], c.key)
			if len(rs) > 0 {
				any = true
			}
			row = append(row, stat(rs, 2))
		}
		rows = append(rows, row)
	}
	if !any {
		return
	}
	fmt.Fprintln(w)
	writeMarkdown(w, rows)
	for _, n := range ratioNotes(systems) {
		fmt.Fprintln(w, n)
	}
}

// stmtFigure is one statement's medians over the rounds.
type stmtFigure struct {
	label     string
	us, calls float64 // exec µs per effect, calls per 1,000 effects
}

// topStatements lists the statements recorded in rs (readStatements'
// stmt_us: and stmt_calls: figures), with their medians over the rounds,
// by execution time per effect, largest first (ties by label); at most k
// (all when k <= 0).
func topStatements(rs []result, k int) []stmtFigure {
	keys := map[string]bool{}
	for _, r := range rs {
		for key := range r {
			if label, ok := strings.CutPrefix(key, "stmt_us:"); ok {
				keys[label] = true
			}
		}
	}
	var list []stmtFigure
	for label := range keys {
		var us, calls []float64
		for _, r := range rs {
			if r != nil {
				us = append(us, r["stmt_us:"+label])
				calls = append(calls, r["stmt_calls:"+label])
			}
		}
		list = append(list, stmtFigure{label, median(us), median(calls)})
	}
	slices.SortFunc(list, func(a, b stmtFigure) int {
		switch {
		case a.us > b.us:
			return -1
		case a.us < b.us:
			return 1
		}
		return strings.Compare(a.label, b.label)
	})
	if k > 0 && len(list) > k {
		list = list[:k]
	}
	return list
}

// medianOf is the median of key over the rounds that ran.
func medianOf(rs []result, key string) float64 {
	var xs []float64
	for _, r := range rs {
		if r != nil {
			if v, ok := r[key]; ok {
				xs = append(xs, v)
			}
		}
	}
	return median(xs)
}

// shortLabel cuts a statement's label to n characters for a table cell; a
// statement named by sqlc's leading comment ("-- name: JobGetAvailable
// :many …", River's) is shown by that name.
func shortLabel(s string, n int) string {
	s = strings.TrimSuffix(s, "…")
	if rest, ok := strings.CutPrefix(s, "-- name: "); ok {
		if f := strings.Fields(rest); len(f) > 0 {
			s = f[0]
		}
	}
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n]) + "…"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}

// printExplain prints issue 32's "explain the rest" table: for every system
// in the drain, per effect, the WAL bytes of the insert and of the drain,
// PostgreSQL's CPU (backends of the database plus the shared background
// processes, from /proc) and pg_stat_statements' execution time, with the
// statements that take most of it (medians over the rounds).
func printExplain(w io.Writer, systems []system, results map[string]map[string][]result, pss bool) {
	rows := [][]string{{"drain, per effect (medians)", "effects/s", "WAL B insert", "WAL B claim+complete",
		"PG CPU µs", "statements µs", "top statements: µs per effect"}}
	for _, s := range systems {
		rs := results["drain"][s.Name()]
		if len(rs) == 0 {
			continue
		}
		top := "pg_stat_statements not preloaded"
		if pss {
			var parts []string
			for _, st := range topStatements(rs, 3) {
				parts = append(parts, fmt.Sprintf("%s %s", fmtNum(st.us, 1), shortLabel(st.label, 48)))
			}
			top = strings.Join(parts, "; ")
		}
		rows = append(rows, []string{s.Name(),
			fmtNum(medianOf(rs, "effects_per_s"), 0),
			fmtNum(medianOf(rs, "wal_insert"), 0),
			fmtNum(medianOf(rs, "wal_drain"), 0),
			fmtNum(medianOf(rs, "cpu_pg")*100, 1), // s per 10k effects -> µs per effect
			fmtNum(medianOf(rs, "stmt_total"), 1),
			top})
	}
	if len(rows) == 1 {
		return
	}
	fmt.Fprintln(w)
	writeMarkdown(w, rows)
}

// printStatements prints, per system, the drain's statements by execution
// time per effect (pg_stat_statements; medians over the rounds).
func printStatements(w io.Writer, systems []system, results map[string]map[string][]result) {
	rows := [][]string{{"drain: pg_stat_statements", "statement", "calls per 1,000 effects", "exec µs per effect"}}
	for _, s := range systems {
		rs := results["drain"][s.Name()]
		list := topStatements(rs, 6)
		if len(list) == 0 {
			continue
		}
		var total []float64
		for _, r := range rs {
			if r != nil {
				total = append(total, r["stmt_total"])
			}
		}
		rows = append(rows, []string{s.Name(), "all statements", "", stat(total, 1)})
		for _, st := range list {
			rows = append(rows, []string{"", strings.ReplaceAll(st.label, "|", "\\|"), fmtNum(st.calls, 2), fmtNum(st.us, 2)})
		}
	}
	if len(rows) == 1 {
		return
	}
	fmt.Fprintln(w)
	writeMarkdown(w, rows)
}

// MarshalJSON writes a figure that is not a number (NaN: not measured, or
// not applicable) as null, which encoding/json cannot do for a float64.
func (r result) MarshalJSON() ([]byte, error) {
	m := make(map[string]*float64, len(r))
	for k, v := range r {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			m[k] = nil
			continue
		}
		m[k] = &v
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads null back as NaN.
func (r *result) UnmarshalJSON(b []byte) error {
	var m map[string]*float64
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	*r = make(result, len(m))
	for k, v := range m {
		if v == nil {
			(*r)[k] = math.NaN()
		} else {
			(*r)[k] = *v
		}
	}
	return nil
}
