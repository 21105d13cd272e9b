package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// serve and work both read OUTBOX_BACKOFF_CAP into the engine's
// Config.BackoffCap (serve used to ignore it). Sequential: t.Setenv.
func TestServeAndWorkReadBackoffCap(t *testing.T) {
	t.Setenv("OUTBOX_BACKOFF_CAP", "7s")
	var out bytes.Buffer
	g := &globals{stdout: &out, stderr: &out, logLevel: "error"}
	for name, cmd := range map[string]*cobra.Command{"serve": newServeCmd(g), "work": newWorkCmd(g)} {
		f := cmd.Flags().Lookup("backoff-cap")
		if f == nil {
			t.Errorf("%s has no --backoff-cap", name)
			continue
		}
		if f.Value.String() != "7s" {
			t.Errorf("%s --backoff-cap = %s from OUTBOX_BACKOFF_CAP=7s", name, f.Value)
		}
	}
	var e engineFlags
	e.register(&cobra.Command{})
	if got := e.config(g, nil).BackoffCap; got != 7*time.Second {
		t.Errorf("engine Config.BackoffCap = %s, want 7s", got)
	}
}
