package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/embedded"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Execute(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, _ := run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "pgoutbox ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestMigrateAndStatus(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t) // already migrated from the template
	code, out, errs := run(t, "--database-url", dsn, "migrate")
	if code != 0 || !strings.Contains(out, "nothing applied") {
		t.Fatalf("migrate on a current database: %d %q %q", code, out, errs)
	}
	checkAllApplied(t, dsn)
}

// checkAllApplied runs `migrate status --json` and checks that it lists
// every line, each migration applied.
func checkAllApplied(t *testing.T, dsn string) {
	t.Helper()
	code, out, _ := run(t, "--database-url", dsn, "migrate", "status", "--json")
	var list []struct {
		Line    string
		Version int64
		Applied bool
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) == 0 {
		t.Fatalf("status --json: %d %q", code, out)
	}
	perLine := map[string]int{}
	for _, m := range list {
		if !m.Applied {
			t.Fatalf("migration %s/%d pending", m.Line, m.Version)
		}
		perLine[m.Line]++
	}
	if perLine["engine"] == 0 || perLine["controlplane"] == 0 || perLine["projection"] == 0 || len(perLine) != 3 {
		t.Fatalf("status --json lists %v migrations per line, want the engine, controlplane and projection lines", perLine)
	}
}

// TestMigrateAdoptsSingleLineDatabase: a database whose single-line
// versions (1 to 9) are all recorded in pgoutbox.goose_db_version, as the
// single line before the split recorded them, is current for migrate,
// which moves the applications' records to their lines' tables (package
// migrations tests the schema). The lines' later versions (above 9, never
// in the single line) stay recorded where they are.
func TestMigrateAdoptsSingleLineDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDB(t)
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	for _, schema := range []string{"control_plane", "storage_documents"} {
		if _, err := c.Exec(ctx, `INSERT INTO pgoutbox.goose_db_version (version_id, is_applied, tstamp)
			SELECT version_id, is_applied, tstamp FROM `+schema+`.goose_db_version WHERE version_id BETWEEN 1 AND 9 ORDER BY id;
			DELETE FROM `+schema+`.goose_db_version WHERE version_id BETWEEN 1 AND 9`); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs := run(t, "--database-url", dsn, "migrate")
	if code != 0 || !strings.Contains(out, "nothing applied") {
		t.Fatalf("migrate on a single-line database: %d %q %q", code, out, errs)
	}
	var moved string
	if err := c.QueryRow(ctx, `SELECT (SELECT string_agg(version_id::text, ',' ORDER BY id) FROM pgoutbox.goose_db_version)
		|| ' / ' || (SELECT string_agg(version_id::text, ',' ORDER BY id) FROM control_plane.goose_db_version)
		|| ' / ' || (SELECT string_agg(version_id::text, ',' ORDER BY id) FROM storage_documents.goose_db_version)`).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	if moved != "0,1,2,5,6,7,8,10,11,12,13,14,15,16,17,18,21,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37 / 0,20,4,9 / 0,3" {
		t.Fatalf("version records after migrate (engine / control plane / projection): %s", moved)
	}
	checkAllApplied(t, dsn)
}

func TestUnreachableDatabaseExitsOne(t *testing.T) {
	t.Parallel()
	code, _, errs := run(t, "--database-url", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", "migrate")
	if code != cli.ExitCouldNotRun || errs == "" {
		t.Fatalf("exit %d, stderr %q; want 1 with a message", code, errs)
	}
}

func TestUnknownCommandExitsOne(t *testing.T) {
	t.Parallel()
	if code, _, _ := run(t, "no-such-command"); code != cli.ExitCouldNotRun {
		t.Fatalf("exit %d", code)
	}
}

func TestServeProbesAndGracefulStop(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := cli.Execute(ctx, []string{"--database-url", dsn, "serve", "--addr", "127.0.0.1:0"}, pw, io.Discard)
		_ = pw.Close()
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	var base string
	for sc.Scan() {
		if i := strings.Index(sc.Text(), "http://"); i >= 0 {
			base = strings.Fields(sc.Text()[i:])[0]
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if base == "" {
		t.Fatal("serve printed no address")
	}
	for _, path := range []string{"/-/healthy", "/-/ready", "/metrics"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
		if path == "/metrics" && !strings.Contains(string(body), "go_goroutines") {
			t.Fatalf("/metrics without the Go collector")
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("serve exited %d after a graceful stop", code)
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestEmbeddedDefault(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	t.Parallel()
	base, err := os.MkdirTemp("", "pgoutbox-cli-*")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(base, 0o755) // the cluster runs as the postgres user when tests run as root
	dir := filepath.Join(base, ".pgoutbox")
	t.Cleanup(func() {
		_ = embedded.ResetLocal(dir)
		_ = os.RemoveAll(base)
	})
	code, out, errs := run(t, "--database-url", "", "--data-dir", dir, "migrate")
	if code != 0 || !strings.Contains(out, "applied") {
		t.Fatalf("first migrate on the embedded default: %d %q %q", code, out, errs)
	}
	code, out, errs = run(t, "--database-url", "", "--data-dir", dir, "migrate")
	if code != 0 || !strings.Contains(out, "nothing applied") || !strings.Contains(errs, "reusing") {
		t.Fatalf("second run must reuse the cluster: %d %q %q", code, out, errs)
	}
}
