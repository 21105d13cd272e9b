package anylang

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// nodeTests runs node's test runner on files of the TypeScript package
// against the database at dsn and fails unless every test passed.
func nodeTests(t *testing.T, ctx context.Context, dir, dsn string, files ...string) {
	t.Helper()
	args := append([]string{"--test", "--test-reporter=tap"}, files...)
	out := run(t, ctx, dir, []string{"DATABASE_URL=" + dsn}, tool(t, "node"), args...)
	summary := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^# (tests|pass|fail|skipped|cancelled|todo) (\d+)$`).FindAllStringSubmatch(out, -1) {
		summary[m[1]] = m[2]
	}
	if summary["tests"] == "" || summary["tests"] == "0" || summary["pass"] != summary["tests"] {
		t.Fatalf("node --test %v: not every test passed (%v):\n%s", files, summary, out)
	}
	t.Logf("TypeScript: %s node tests passed (%v)", summary["pass"], files)
}

// TestTypeScriptWorker runs the Worker's node tests (clients/typescript,
// test/worker.test.mjs) on a fresh database: delivery at a bounded
// concurrency, every outcome's route, lease extension, NOTIFY wake-ups,
// graceful stop, and a queue not granted.
func TestTypeScriptWorker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := buildTypeScript(t, ctx)
	_, dsn := pgtest.NewPool(t)
	nodeTests(t, ctx, dir, dsn, "test/worker.test.mjs")
}
