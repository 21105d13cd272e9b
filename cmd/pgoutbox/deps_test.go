package main

import (
	"os/exec"
	"strings"
	"testing"
)

// testOnly are packages that exist for tests: none may be linked into the
// binary. internal/pgtest is the test harness (its sibling internal/embedded
// is the binary's default database); testing registers test flags and
// brings the test runner; net/http/httptest registers a global
// -httptest.serve flag (the demo's emulators serve through
// adapters/internal/loopback instead).
var testOnly = []string{
	"testing",
	"net/http/httptest",
	"github.com/pgoutbox/pgoutbox/internal/pgtest",
	"go.uber.org/goleak",
}

// TestBinaryCarriesNoTestCode is the CI check that the pgoutbox binary links
// no test code: `go list -deps` of this package (every package the binary
// is built from) names none of testOnly, nor any testing/... package.
func TestBinaryCarriesNoTestCode(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the binary's packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || deps[len(deps)-1] != "github.com/pgoutbox/pgoutbox/cmd/pgoutbox" {
		t.Fatalf("go list -deps printed %d packages, ending with %q: not the binary's list", len(deps), deps[len(deps)-1])
	}
	for _, p := range deps {
		for _, banned := range testOnly {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("the binary links %s (test code); see who imports it: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/pgoutbox | grep %s", p, banned)
			}
		}
	}
}
