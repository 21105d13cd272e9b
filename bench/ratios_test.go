package main

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

func systemsFor(t *testing.T, names string) []system {
	t.Helper()
	o, err := parseFlags([]string{"-systems", names})
	if err != nil {
		t.Fatal(err)
	}
	var out []system
	for _, n := range o.systems {
		s, err := o.system(n)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func pairNames(pairs [][2]system) []string {
	var out []string
	for _, p := range pairs {
		out = append(out, p[1].Name()+" / "+p[0].Name())
	}
	return out
}

// The default systems give every pgoutbox mode its ratio to River, to PgQ,
// to the ceiling of its own lease mode and to ceiling[delete], each once;
// batch storage, which has no lease-mode ceiling, to River, PgQ and
// ceiling[delete], and the output says why.
func TestRatioPairsDefaultSystems(t *testing.T) {
	sys := systemsFor(t, defaultSystems)
	got := strings.Join(pairNames(ratioPairs(sys)), "\n")
	want := strings.Join([]string{
		"pgoutbox / River",
		"pgoutbox[row-lock=off] / River",
		"pgoutbox[storage=batch] / River",
		"PgQ / River",
		"ceiling[row-lock] / River",
		"ceiling / River",
		"ceiling[delete] / River",
		"pgoutbox / PgQ",
		"pgoutbox / ceiling[row-lock]",
		"pgoutbox / ceiling[delete]",
		"pgoutbox[row-lock=off] / PgQ",
		"pgoutbox[row-lock=off] / ceiling",
		"pgoutbox[row-lock=off] / ceiling[delete]",
		"pgoutbox[storage=batch] / PgQ",
		"pgoutbox[storage=batch] / ceiling[delete]",
	}, "\n")
	if got != want {
		t.Fatalf("ratio pairs:\n%s\nwant:\n%s", got, want)
	}
	notes := ratioNotes(sys)
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "pgoutbox[storage=batch] has no ceiling of its own lease mode") ||
		!strings.HasSuffix(notes[0], "its ceiling ratio is to ceiling[delete].") {
		t.Fatalf("ratio notes: %q", notes)
	}
	// The notes and the pairs are printed with the ratios.
	results := map[string]map[string][]result{"drain": {}}
	for _, s := range sys {
		results["drain"][s.Name()] = []result{{"effects_per_s": 1000}}
	}
	var out bytes.Buffer
	printRatios(&out, sys, results)
	if !strings.Contains(out.String(), "| pgoutbox[storage=batch] / ceiling[delete] ") || !strings.Contains(out.String(), notes[0]+"\n") {
		t.Fatalf("printRatios:\n%s", out.String())
	}
}

// Without ceiling[delete], batch storage has no ceiling ratio at all, and
// the note says what to run for one; a rows pgoutbox has no note.
func TestRatioPairsBatchWithoutDeleteCeiling(t *testing.T) {
	sys := systemsFor(t, "river,pgoutbox[storage=batch;page=500],ceiling[row-lock],pgoutbox[storage=rows]")
	got := strings.Join(pairNames(ratioPairs(sys)), "; ")
	want := "pgoutbox[storage=batch;page=500] / River; ceiling[row-lock] / River; pgoutbox[storage=rows] / River; " +
		"pgoutbox[storage=rows] / ceiling[row-lock]"
	if got != want {
		t.Fatalf("ratio pairs: %s, want %s", got, want)
	}
	notes := ratioNotes(sys)
	if len(notes) != 1 || !strings.HasSuffix(notes[0], "; run ceiling[delete] for its ceiling ratio.") {
		t.Fatalf("ratio notes: %q", notes)
	}
}

// With PgQ first (the reference of every row), its pair with pgoutbox is
// not listed twice; with no PgQ and no delete ceiling (PgQ skipped), only
// River's and the lease-mode ceiling's ratios remain.
func TestRatioPairsWithoutReferences(t *testing.T) {
	got := strings.Join(pairNames(ratioPairs(systemsFor(t, "pgq,pgoutbox,ceiling[delete]"))), "; ")
	if want := "pgoutbox / PgQ; ceiling[delete] / PgQ; pgoutbox / ceiling[delete]"; got != want {
		t.Fatalf("pgq first: %s, want %s", got, want)
	}
	got = strings.Join(pairNames(ratioPairs(systemsFor(t, "river,pgoutbox,ceiling[row-lock]"))), "; ")
	if want := "pgoutbox / River; ceiling[row-lock] / River; pgoutbox / ceiling[row-lock]"; got != want {
		t.Fatalf("no pgq: %s, want %s", got, want)
	}
}

// The ratio of a pair is round by round, NaN where a round failed.
func TestPairRatiosRoundByRound(t *testing.T) {
	a := []result{{"x": 100}, nil, {"x": 200}}
	b := []result{{"x": 300}, {"x": 1}, {"x": 100}}
	got := pairRatios(a, b, "x")
	if len(got) != 3 || got[0] != 3 || !math.IsNaN(got[1]) || got[2] != 0.5 {
		t.Fatalf("pairRatios = %v, want [3 NaN 0.5]", got)
	}
	if s := stat(got, 2); s != "1.75 [0.50 – 3.00]" {
		t.Fatalf("stat = %q", s)
	}
}

func TestSystemParsing(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := o.system("ceiling[delete;batch=50]")
	if err != nil {
		t.Fatal(err)
	}
	c := s.(*ceilingSystem)
	if !c.delete || c.rowLock || c.batch != 50 || c.ClaimLatencySQL() != "" || supports(c, "latency") {
		t.Fatalf("ceiling[delete;batch=50] = %+v", c)
	}
	if s, err = o.system("PgQ"); err != nil {
		t.Fatal(err)
	}
	if p := s.(*pgqSystem); p.tickEvery != o.pgqTicker || supports(p, "scale") || !supports(p, "latency") {
		t.Fatalf("pgq = %+v", p)
	}
	for _, bad := range []string{"ceiling[delete;row-lock]", "pgq[x=1]", "ceiling[deletes]"} {
		if _, err := o.system(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	if _, err := parseFlags([]string{"-pgq-ticker", "0s"}); err == nil {
		t.Error("-pgq-ticker 0s: no error")
	}
	// A pgoutbox's lease-mode ceiling is never the delete ceiling.
	sys := systemsFor(t, "pgoutbox[row-lock=off],ceiling[delete],ceiling")
	if c := ceilingFor(sys[0], sys); c == nil || c.Name() != "ceiling" {
		t.Fatalf("ceilingFor(durable) = %v", c)
	}
}

// topStatements takes the medians over the rounds and orders by time per
// effect; shortLabel keeps a table cell short and its pipes escaped.
func TestTopStatements(t *testing.T) {
	rs := []result{
		{"stmt_us:A": 1, "stmt_calls:A": 10, "stmt_us:B": 5, "stmt_calls:B": 1, "stmt_total": 6},
		{"stmt_us:A": 3, "stmt_calls:A": 10, "stmt_us:B": 4, "stmt_calls:B": 1, "stmt_us:C": 9},
		nil,
		{"stmt_us:A": 2, "stmt_calls:A": 20, "stmt_us:B": 6, "stmt_calls:B": 3},
	}
	got := topStatements(rs, 2)
	if len(got) != 2 || got[0].label != "B" || got[0].us != 5 || got[0].calls != 1 ||
		got[1].label != "A" || got[1].us != 2 || got[1].calls != 10 {
		t.Fatalf("topStatements = %+v", got)
	}
	// C ran in one round of three: its median counts the others as 0.
	if all := topStatements(rs, 0); len(all) != 3 || all[2].label != "C" || all[2].us != 0 {
		t.Fatalf("all statements = %+v", all)
	}
	if s := shortLabel("SELECT a | b FROM t WHERE x", 12); s != "SELECT a \\| b…" {
		t.Fatalf("shortLabel = %q", s)
	}
	if s := shortLabel("-- name: JobGetAvailable :many WITH locked_jobs AS (", 48); s != "JobGetAvailable" {
		t.Fatalf("shortLabel of a sqlc statement = %q", s)
	}
	if m := medianOf(rs, "stmt_total"); m != 6 {
		t.Fatalf("medianOf = %v", m)
	}
}

// unavailablePgQ is PgQ on a server without the extension.
type unavailablePgQ struct{ *pgqSystem }

func (unavailablePgQ) available(context.Context, *pgxpool.Pool) error {
	return errors.New("the pgq extension is not installed")
}

// A system the server cannot run is dropped with its reason printed on
// both outputs; the others run, and the ratios are those that remain.
func TestUnavailableSystemIsSkipped(t *testing.T) {
	sys := systemsFor(t, "river,pgoutbox,ceiling[delete]")
	in := []system{sys[0], sys[1], unavailablePgQ{&pgqSystem{}}, sys[2]}
	var out, errOut bytes.Buffer
	got := availableSystems(context.Background(), nil, in, &out, &errOut)
	if len(got) != 3 || got[0] != sys[0] || got[1] != sys[1] || got[2] != sys[2] {
		t.Fatalf("available systems: %v", got)
	}
	want := "PgQ skipped: the pgq extension is not installed\n"
	if out.String() != want || errOut.String() != want {
		t.Fatalf("printed %q and %q, want %q on both", out.String(), errOut.String(), want)
	}
	if p := strings.Join(pairNames(ratioPairs(got)), "; "); p != "pgoutbox / River; ceiling[delete] / River; pgoutbox / ceiling[delete]" {
		t.Fatalf("ratio pairs: %s", p)
	}
}
