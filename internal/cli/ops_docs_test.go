package cli_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/cli"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/cli.md from the command tree")

// TestCLIDocs checks that docs/cli.md is the command reference generated
// from the command tree (`pgoutbox docs`); -update-docs rewrites it.
//
// Flag defaults are read from the environment, so the tree is built with an
// empty one. That needs t.Setenv, which a parallel test may not call: this
// test is sequential on purpose, and it runs before the parallel tests of
// the package resume, so none of them sees the emptied environment.
func TestCLIDocs(t *testing.T) {
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "" || name == "PATH" || name == "HOME" || name == "TMPDIR" {
			continue
		}
		t.Setenv(name, "") // restored after the test
		if err := os.Unsetenv(name); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	if code := cli.Execute(context.Background(), []string{"docs"}, &out, &errb); code != 0 {
		t.Fatalf("pgoutbox docs: exit %d: %s", code, errb.String())
	}
	path := filepath.Join("..", "..", "docs", "cli.md")
	if *updateDocs {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (generate it: go test ./internal/cli -run TestCLIDocs -update-docs)", err)
	}
	if !bytes.Equal(want, out.Bytes()) {
		t.Fatalf("docs/cli.md is out of date with the command tree; regenerate it:\n" +
			"  go test ./internal/cli -run TestCLIDocs -update-docs")
	}
	for _, cmd := range []string{"## pgoutbox status", "## pgoutbox dlq replay", "## pgoutbox alert check",
		"## pgoutbox requeue-stale", "## pgoutbox readiness broker", "OUTBOX_REPLAY_BATCH_LIMIT"} {
		if !strings.Contains(out.String(), cmd) {
			t.Errorf("the reference lacks %q", cmd)
		}
	}
	if strings.Contains(out.String(), "## pgoutbox docs") {
		t.Error("the hidden docs command documents itself")
	}
}
