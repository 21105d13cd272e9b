package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
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

// The storage and page knobs of a pgoutbox variant reach its knobs and its
// tables; bad values are refused with what is allowed.
func TestPgoutboxStorageKnobs(t *testing.T) {
	o, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(o.systems, ","), "pgoutbox[storage=batch]") {
		t.Fatalf("default systems %v lack pgoutbox[storage=batch]", o.systems)
	}
	s, err := o.system("pgoutbox[storage=batch;page=250]")
	if err != nil {
		t.Fatal(err)
	}
	p := s.(*pgSystem)
	if p.knobs.storage != pgoutbox.StorageBatch || p.knobs.pageSize != 250 || !p.batch() {
		t.Fatalf("knobs = %+v", p.knobs)
	}
	if p.Tables()[0] != "pgoutbox.stream_batches" || !strings.Contains(strings.Join(p.Tables(), ","), "pgoutbox.stream_2") {
		t.Fatalf("batch tables = %v", p.Tables())
	}
	if p.ClaimLatencySQL() != "" || !strings.Contains(p.DiagnoseSQL(), "pgoutbox.stream_batches") {
		t.Fatal("batch storage: claim latency measured, or open batches not diagnosed")
	}
	if s, err = o.system("pgoutbox"); err != nil {
		t.Fatal(err)
	}
	if p := s.(*pgSystem); p.batch() || p.knobs.storage != "" || p.Tables()[0] != "pgoutbox.effects" || p.ClaimLatencySQL() == "" {
		t.Fatalf("pgoutbox = %+v, tables %v", p.knobs, p.Tables())
	}
	for bad, msg := range map[string]string{
		"pgoutbox[storage=stream]": `storage="stream": rows or batch`,
		"pgoutbox[page=0]":         "page=0: a positive number of effects",
		"pgoutbox[page=x]":         "invalid syntax",
		"pgoutbox[pages=10]":       `unknown knob "pages"`,
	} {
		if _, err := o.system(bad); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want %q", bad, err, msg)
		}
	}
}
