package demo

import (
	"strings"
	"testing"
)

// TestHintsAfterExitWhenDone: after --exit-when-done nothing of the demo is
// left running, so the hints name neither /workers nor the GitHub emulator's
// commands, and every command runs the binary as it was started.
func TestHintsAfterExitWhenDone(t *testing.T) {
	d := &Demo{o: Options{Command: "./bin/pgoutbox", ExitWhenDone: true}, base: "http://127.0.0.1:1"}
	hints := d.hints(7)
	all := strings.Join(hints, "\n")
	for _, gone := range []string{"/workers", "keeps serving", "reconcile inspect", "reconcile resolve", "export "} {
		if strings.Contains(all, gone) {
			t.Errorf("hints after --exit-when-done contain %q:\n%s", gone, all)
		}
	}
	for _, h := range hints {
		if !strings.HasPrefix(h, "./bin/pgoutbox ") {
			t.Errorf("hint %q does not run ./bin/pgoutbox", h)
		}
	}
}
