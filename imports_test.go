package pgoutbox_test

import (
	"os/exec"
	"strings"
	"testing"
)

// module is this module's path.
const module = "github.com/pgoutbox/pgoutbox"

// builtOnTheLibrary are the packages that are examples of building on the
// library (README, "Layers"): the applications and the adapters. They use
// the root package's public API, never the engine's internals.
var builtOnTheLibrary = []string{"./controlplane/...", "./projection/...", "./adapters/..."}

// sharedPlumbing are the internal packages an application or adapter may
// import: plumbing with no engine state and no statement of the engine
// (HTTP error bodies and bearer checks; the start/stop of a service's
// goroutines). Every other package under internal/ (core, store, ops,
// console, cli, server, ...) is the engine's or the binary's.
var sharedPlumbing = []string{module + "/internal/httpx", module + "/internal/lifecycle"}

// goList runs go list -f format over pkgs and returns its lines.
func goList(t *testing.T, format string, pkgs ...string) []string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the packages' imports: %v", err)
	}
	out, err := exec.Command(goBin, append([]string{"list", "-f", format}, pkgs...)...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// engineImports returns the imports among imports that are the engine's
// internal packages.
func engineImports(imports []string) []string {
	var bad []string
	for _, imp := range imports {
		if strings.HasPrefix(imp, module+"/internal/") && !contains(sharedPlumbing, imp) {
			bad = append(bad, imp)
		}
	}
	return bad
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestApplicationsUseThePublicAPI fails when controlplane, projection or an
// adapter (their non-test code) imports an internal package of the engine
// (issue 29): whatever they need is the root package's public API. The
// plumbing they may share imports no engine package either.
func TestApplicationsUseThePublicAPI(t *testing.T) {
	lines := goList(t, `{{.ImportPath}} {{join .Imports " "}}`, builtOnTheLibrary...)
	if len(lines) < 10 {
		t.Fatalf("go list printed %d packages: not the applications and adapters", len(lines))
	}
	seen := map[string]bool{}
	for _, line := range lines {
		f := strings.Fields(line)
		seen[f[0]] = true
		for _, bad := range engineImports(f[1:]) {
			t.Errorf("%s imports %s, an internal package of the engine: use the root package's public API "+
				"(or, for plumbing with no engine state, add it to sharedPlumbing)", f[0], bad)
		}
	}
	for _, p := range []string{"/controlplane", "/projection", "/adapters/nats", "/adapters/nats/internal/handoff"} {
		if !seen[module+p] {
			t.Errorf("%s was not checked", module+p)
		}
	}
	for _, line := range goList(t, `{{.ImportPath}} {{join .Deps " "}}`, sharedPlumbing...) {
		f := strings.Fields(line)
		for _, bad := range engineImports(f[1:]) {
			t.Errorf("shared plumbing %s depends on %s, an internal package of the engine", f[0], bad)
		}
	}
}
