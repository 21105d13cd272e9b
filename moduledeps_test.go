package pgoutbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// binaryOnly are the modules of the binary and of the repository's own tests
// (the CLI, its progress bars, the console's browser tests, the embedded NATS
// server of the relay's tests). A library user must not download them: with
// Go's module graph pruning a user's `go build` fetches the modules of the
// packages it compiles, and `go mod tidy` also those of the tests of the
// packages it imports, so neither list may name them (docs/operations.md,
// "What a library user downloads").
var binaryOnly = []string{
	"github.com/spf13/cobra",
	"github.com/spf13/pflag",
	"github.com/schollz/progressbar/v3",
	"github.com/chromedp/chromedp",
	"github.com/chromedp/cdproto",
	"github.com/nats-io/nats-server/v2",
}

// natsServer is the one exception: adapters/nats's tests run an embedded NATS
// server, so `go mod tidy` in a module that imports adapters/nats downloads
// it (its build does not).
const natsServer = "github.com/nats-io/nats-server/v2"

// TestLibraryLeavesBinaryDependenciesOut checks what a library user's build
// and `go mod tidy` reach: the packages (and, with -test, their tests'
// packages) of the root package, migrations and every adapter. None may come
// from binaryOnly, except natsServer in adapters/nats's tests.
func TestLibraryLeavesBinaryDependenciesOut(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the library's packages: %v", err)
	}
	golist := func(args ...string) []string {
		t.Helper()
		out, err := exec.Command(goBin, append([]string{"list"}, args...)...).Output()
		if err != nil {
			var stderr string
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
		}
		return strings.Fields(string(out))
	}
	const natsAdapter = "github.com/pgoutbox/pgoutbox/adapters/nats"
	library := []string{"github.com/pgoutbox/pgoutbox", "github.com/pgoutbox/pgoutbox/migrations"}
	var others []string // the adapters whose tests must not reach natsServer either
	for _, p := range golist("./adapters/...") {
		library = append(library, p)
		if p != natsAdapter {
			others = append(others, p)
		}
	}
	if len(others) < 5 || len(others) == len(library)-2 {
		t.Fatalf("go list ./adapters/... named %v: not the adapters (with %s)", others, natsAdapter)
	}
	check := func(what string, deps []string, allowed string) {
		t.Helper()
		if len(deps) < 20 {
			t.Fatalf("%s: go list printed %d packages: not a dependency list", what, len(deps))
		}
		reported := map[string]bool{}
		for _, p := range deps {
			for _, m := range binaryOnly {
				if m != allowed && !reported[m] && (p == m || strings.HasPrefix(p, m+"/")) {
					reported[m] = true
					t.Errorf("%s reach %s (module %s); see who imports it: go list -deps -test -f '{{.ImportPath}}: {{.Imports}}' ./... | grep %s", what, p, m, m)
				}
			}
		}
	}
	check("the library's packages", golist(append([]string{"-deps"}, library...)...), "")
	check("the tests of the library's packages", golist(append([]string{"-deps", "-test"}, append(library[:2:2], others...)...)...), "")
	check("adapters/nats and its tests", golist("-deps", "-test", natsAdapter), natsServer)
}
