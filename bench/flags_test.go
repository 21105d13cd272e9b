package main

import (
	"os"
	"path/filepath"
	"testing"
)

// recordedFlags names a path inside the repository relative to bench/, and
// leaves other arguments alone.
func TestRecordedFlagsHidesTheCheckoutPath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Args
	defer func() { os.Args = saved }()
	os.Args = []string{"bench", "-local", filepath.Join(filepath.Dir(wd), ".pgoutbox-bench"), "-json", "out.json", "-dsn", "/elsewhere/x"}
	want := "-local ../.pgoutbox-bench -json out.json -dsn /elsewhere/x"
	if got := recordedFlags(); got != want {
		t.Fatalf("recordedFlags() = %q, want %q", got, want)
	}
}
