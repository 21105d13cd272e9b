package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// engineRows counts the engine's rows (effects and key rows), which bench
// must leave as it found them.
func engineRows(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM pgoutbox.effects) + (SELECT count(*) FROM pgoutbox.effect_keys)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBenchCommand runs `pgoutbox bench` small: --json carries the drain
// throughput at drain.effects_per_second and the configuration it ran
// with, the text report has a line per scenario, the bench queue's rows
// are deleted afterwards, and bad flags are refused before anything is
// written.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	before := engineRows(t, pool)

	for _, bad := range [][]string{{"--effects", "0"}, {"--payload-bytes", "5"}, {"--claim-cooldown", "-1ms"}, {"--row-lock", "-1s"}} {
		code, _, errs := run(t, append([]string{"--database-url", dsn, "bench"}, bad...)...)
		if code != cli.ExitCouldNotRun || !strings.Contains(errs, "must be positive") {
			t.Fatalf("bench %v: exit %d, stderr %q; want %d and a clear error", bad, code, errs, cli.ExitCouldNotRun)
		}
		if n := engineRows(t, pool); n != before {
			t.Fatalf("bench %v wrote rows: %d → %d", bad, before, n)
		}
	}

	code, out, errs := run(t, "--database-url", dsn, "bench", "--json", "--effects", "2000", "--concurrency", "50",
		"--claim-batch", "50", "--clients", "1", "--row-lock", "20ms", "--claim-cooldown", "1ms", "--sustained", "0", "--latency", "0")
	if code != 0 {
		t.Fatalf("bench --json: exit %d, stderr %q", code, errs)
	}
	var rep struct {
		Config struct {
			Effects       int    `json:"effects"`
			RowLockLease  string `json:"row_lock_lease"`
			ClaimCooldown string `json:"claim_cooldown"`
		} `json:"config"`
		Drain struct {
			Effects          int     `json:"effects"`
			EffectsPerSecond float64 `json:"effects_per_second"`
		} `json:"drain"`
		Sustained *json.RawMessage `json:"sustained"`
		Latency   *json.RawMessage `json:"latency"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("bench --json printed %q: %v", out, err)
	}
	if rep.Drain.Effects != 2000 || rep.Drain.EffectsPerSecond <= 0 || rep.Config.Effects != 2000 ||
		rep.Config.RowLockLease != "20ms" || rep.Config.ClaimCooldown != "1ms" {
		t.Fatalf("report %+v: want 2,000 drained effects, a positive rate and the flags' configuration", rep)
	}
	if rep.Sustained != nil || rep.Latency != nil {
		t.Fatalf("--sustained 0 --latency 0 still reported %s %s", ptr(rep.Sustained), ptr(rep.Latency))
	}
	if n := engineRows(t, pool); n != before {
		t.Fatalf("bench left rows behind: %d → %d", before, n)
	}

	code, out, errs = run(t, "--database-url", dsn, "bench", "--effects", "500", "--concurrency", "20", "--claim-batch", "20",
		"--clients", "1", "--sustained", "200ms", "--producers", "1", "--latency", "200ms", "--rate", "50", "--latency-producers", "1")
	if code != 0 {
		t.Fatalf("bench: exit %d, stderr %q", code, errs)
	}
	for _, line := range []string{"pgoutbox bench: 500 effects", "\ndrain ", "\nsustained ", "\nlatency "} {
		if !strings.Contains(out, line) {
			t.Fatalf("bench output has no %q:\n%s", line, out)
		}
	}
	if n := engineRows(t, pool); n != before {
		t.Fatalf("bench left rows behind: %d → %d", before, n)
	}
}

func ptr(m *json.RawMessage) string {
	if m == nil {
		return "null"
	}
	return string(*m)
}
