package cli

// Tests of the projection's commands. They set environment variables
// (t.Setenv), which forbids t.Parallel: they run sequentially.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	fakesolr "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/projection"
)

// clearProjectionEnv unsets every variable the projection reads.
func clearProjectionEnv(t *testing.T) {
	for _, v := range []string{"OUTBOX_PROJECT_TO_SOLR", "OUTBOX_PROJECT_TO_GRAPHDB", "SOLR_BASE_URL", "SOLR_CORE",
		"SOLR_USERNAME", "SOLR_PASSWORD", "GRAPHDB_BASE_URL", "GRAPHDB_REPOSITORY_ID", "GRAPHDB_UPDATE_URL",
		"CRON_SECRET", "METAMUSEUM_OUTBOX_CRON_ENABLED", "PGOUTBOX_API_TOKEN"} {
		t.Setenv(v, "")
	}
}

// runCommand runs cmd (built on fresh globals for dsn) with args and returns
// the exit code and stdout.
func runCommand(t *testing.T, dsn string, build func(*globals) *cobra.Command, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	g := &globals{databaseURL: dsn, stdout: &out, stderr: &errb, logLevel: "error"}
	cmd := build(g)
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	code := ExitOK
	var ee *ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.Code
	case err != nil:
		code = ExitCouldNotRun
	}
	if err != nil {
		t.Logf("%v (stderr %s)", err, errb.String())
	}
	return code, out.String()
}

func importRecords(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var sb strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&sb, `{"id":"c%d","title":"T %d"}`+"\n", i, i)
	}
	res, err := projection.Import(context.Background(), pool, projection.FormatNDJSON, strings.NewReader(sb.String()), 0, 0, 0)
	if err != nil || res.Written != int64(n) {
		t.Fatalf("import: %v %+v", err, res)
	}
}

func effectsIn(t *testing.T, pool *pgxpool.Pool, state string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pgoutbox.effects WHERE state = $1::pgoutbox.effect_state`, state).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestProjectorCommands(t *testing.T) {
	clearProjectionEnv(t)
	pool, dsn := pgtest.NewPool(t)
	importRecords(t, pool, 250)

	// No target: nothing claimed.
	code, out := runCommand(t, dsn, newProjectorCmd, "once")
	if code != 0 || !strings.Contains(out, "no projection target is enabled") {
		t.Fatalf("once without a target: %d %q", code, out)
	}
	if n := effectsIn(t, pool, "available"); n != 250 {
		t.Fatalf("%d available after a run without target, want 250", n)
	}

	s := fakesolr.New(fakesolr.Options{})
	t.Cleanup(s.Close)
	t.Setenv("OUTBOX_PROJECT_TO_SOLR", "1")
	t.Setenv("SOLR_BASE_URL", s.URL())

	// Solr on without SOLR_CORE: the command names the variable (the
	// library names the field, Config.Core) and claims nothing.
	code, out = runCommand(t, dsn, newProjectorCmd, "once")
	if code != 0 || !strings.Contains(out, "(solr: SOLR_CORE is empty;") || strings.Contains(out, "Config.") {
		t.Fatalf("once without SOLR_CORE: %d %q", code, out)
	}
	if n := effectsIn(t, pool, "available"); n != 250 {
		t.Fatalf("%d available after a run without SOLR_CORE, want 250", n)
	}

	t.Setenv("SOLR_CORE", fakesolr.CoreDefault)

	code, out = runCommand(t, dsn, newProjectorCmd, "once", "--batch", "10", "--json")
	var sum projection.Summary
	if code != 0 || json.Unmarshal([]byte(out), &sum) != nil || sum.Claimed != 10 || sum.Projected != 10 || sum.Remaining != 240 {
		t.Fatalf("once --json: %d %q", code, out)
	}
	// Bad input: a non-positive batch is refused and claims nothing.
	if code, out = runCommand(t, dsn, newProjectorCmd, "drain", "--batch", "0"); code != 1 || effectsIn(t, pool, "available") != 240 {
		t.Fatalf("drain --batch 0: %d %q", code, out)
	}
	// Each progress line counts its own batch (issue 17, point 8: they
	// were the running totals), then the totals so far.
	code, out = runCommand(t, dsn, newProjectorCmd, "drain", "--batch", "100")
	if code != 0 || !strings.Contains(out, "batch 1: claimed 100, projected 100, retried 0, dead-lettered 0 (so far: claimed 100, projected 100)\n") ||
		!strings.Contains(out, "batch 2: claimed 100, projected 100, retried 0, dead-lettered 0 (so far: claimed 200, projected 200)\n") ||
		!strings.Contains(out, "batch 3: claimed 40, projected 40, retried 0, dead-lettered 0 (so far: claimed 240, projected 240)\n") ||
		!strings.Contains(out, "projected 240, retried 0, dead-lettered 0, remaining 0") {
		t.Fatalf("drain: %d %q", code, out)
	}
	if s.Count(fakesolr.CoreDefault) != 250 || effectsIn(t, pool, "completed") != 250 {
		t.Fatalf("after drain: %d documents", s.Count(fakesolr.CoreDefault))
	}
}

func TestReadinessProjectionCommand(t *testing.T) {
	clearProjectionEnv(t)
	pool, dsn := pgtest.NewPool(t)
	importRecords(t, pool, 12)
	dir := t.TempDir()
	out := filepath.Join(dir, "launch", "readiness.json")
	read := func() projection.Readiness {
		t.Helper()
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var r projection.Readiness
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		name  string
		env   map[string]string
		args  []string
		code  int
		class string
	}{
		{"portable from the database", nil, []string{"--check"}, 0, "portable"},
		{"watch", nil, []string{"--records", "40000", "--check"}, 0, "watch"},
		{"enable without check", nil, []string{"--records", "50000"}, 0, "enable"},
		{"enable with check", nil, []string{"--records", "50000", "--check"}, ExitCheckFailed, "enable"},
		{"graph p95 with check", nil, []string{"--graph-p95-ms", "1500", "--check"}, ExitCheckFailed, "enable"},
		{"solr on, cron off", map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "SOLR_BASE_URL": "http://127.0.0.1:1/solr", "SOLR_CORE": "c"},
			[]string{"--records", "50000", "--check"}, ExitCheckFailed, "enable"},
		{"enabled", map[string]string{"OUTBOX_PROJECT_TO_SOLR": "1", "SOLR_BASE_URL": "http://127.0.0.1:1/solr", "SOLR_CORE": "c",
			"CRON_SECRET": "x", "METAMUSEUM_OUTBOX_CRON_ENABLED": "1"}, []string{"--records", "50000", "--check"}, 0, "enabled"},
		{"negative input", nil, []string{"--records", "1", "--search-p95-ms", "-1"}, ExitCouldNotRun, ""},
	} {
		clearProjectionEnv(t)
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		_ = os.Remove(out)
		code, stdout := runCommand(t, dsn, newReadinessProjectionCmd, append(tc.args, "--output", out)...)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d (%s)", tc.name, code, tc.code, stdout)
			continue
		}
		if tc.class == "" {
			if _, err := os.Stat(out); err == nil {
				t.Errorf("%s: artifact written on bad input", tc.name)
			}
			continue
		}
		r := read()
		if r.Classification != tc.class || !strings.Contains(stdout, "classification:     "+tc.class) {
			t.Errorf("%s: %s (stdout %q)", tc.name, r.Classification, stdout)
		}
		if tc.name == "portable from the database" && (r.Inputs.Records != 12 || !r.Inputs.RecordsFromDatabase) {
			t.Errorf("records from the database: %+v", r.Inputs)
		}
	}
}
