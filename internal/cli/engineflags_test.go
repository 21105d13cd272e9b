package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
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

// serve and work read OUTBOX_ROW_LOCK_LEASE (default the engine's 50 ms; 0
// turns row-lock leases off) into the queues that do not set their own,
// and refuse a negative value before opening anything. Sequential:
// t.Setenv.
func TestServeAndWorkReadRowLockLease(t *testing.T) {
	var out bytes.Buffer
	g := &globals{stdout: &out, stderr: &out, logLevel: "error"}
	for _, tc := range []struct {
		env       string
		own, want time.Duration // the app queue's own RowLockLease, the result
	}{
		{"", 0, 0},   // the engine default applies in NewClient
		{"0", 0, -1}, // off: durable leases
		{"20ms", 0, 20 * time.Millisecond},
		{"0", 5 * time.Millisecond, 5 * time.Millisecond}, // a queue's own setting wins
	} {
		if tc.env == "" {
			t.Setenv("OUTBOX_ROW_LOCK_LEASE", "")
		} else {
			t.Setenv("OUTBOX_ROW_LOCK_LEASE", tc.env)
		}
		for name, cmd := range map[string]*cobra.Command{"serve": newServeCmd(g), "work": newWorkCmd(g)} {
			if f := cmd.Flags().Lookup("row-lock-lease"); f == nil {
				t.Fatalf("%s has no --row-lock-lease", name)
			}
		}
		var e engineFlags
		e.register(&cobra.Command{})
		if err := e.validate(); err != nil {
			t.Fatalf("OUTBOX_ROW_LOCK_LEASE=%q: %v", tc.env, err)
		}
		cfg := pgoutbox.Config{Queues: map[string]pgoutbox.QueueConfig{"q": {RowLockLease: tc.own}}}
		e.queueDefaults(&cfg)
		if got := cfg.Queues["q"].RowLockLease; got != tc.want {
			t.Errorf("OUTBOX_ROW_LOCK_LEASE=%q, queue's own %s: RowLockLease %s, want %s", tc.env, tc.own, got, tc.want)
		}
	}
	t.Setenv("OUTBOX_ROW_LOCK_LEASE", "-1s")
	var e engineFlags
	e.register(&cobra.Command{})
	if err := e.validate(); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("OUTBOX_ROW_LOCK_LEASE=-1s: %v, want a refusal", err)
	}
}
