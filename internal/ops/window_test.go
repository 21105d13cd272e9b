package ops

import (
	"testing"
	"time"
)

// One window, one name: status, the console and /workers say "completed in
// the last 5 min", and a snapshot carries the name of its own window.
func TestCompletedWindowName(t *testing.T) {
	if CompletedWindowLabel != "completed in the last 5 min" || LagWindowDefault != CompletedWindow {
		t.Fatalf("CompletedWindowLabel %q, LagWindowDefault %s, CompletedWindow %s", CompletedWindowLabel, LagWindowDefault, CompletedWindow)
	}
	for d, want := range map[time.Duration]string{
		time.Minute:      "completed in the last 1 min",
		time.Hour:        "completed in the last 60 min",
		90 * time.Second: "completed in the last 1m30s",
	} {
		if got := WindowLabel(d); got != want {
			t.Errorf("WindowLabel(%s) = %q, want %q", d, got, want)
		}
	}
}
