package cli_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestDemoExitWhenDoneJSON(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	started := time.Now()
	code, out, errs := run(t, "--database-url", dsn, "demo", "--exit-when-done", "--json", "--records", "200")
	t.Logf("demo took %s (reported, not asserted)", time.Since(started))
	if code != 0 {
		t.Fatalf("demo exited %d: %s", code, errs)
	}
	var s struct {
		Lost           int64 `json:"lost"`
		Effects        int64 `json:"effects"`
		Reconciliation int64 `json:"reconciliation_required"`
		DeadLetters    int64 `json:"dead_letters"`
		States         []struct {
			Queue, State string
			Count        int64
		} `json:"states"`
	}
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, out)
	}
	want := map[string]int64{
		"control_plane_jobs/completed": 4, "control_plane_outbox/completed": 4,
		"control_plane_outbox/reconciliation_required": 1,
		"outbox_events/completed":                      199, "outbox_events/dead_letter": 1,
	}
	got := map[string]int64{}
	for _, st := range s.States {
		got[st.Queue+"/"+st.State] = st.Count
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d", k, got[k], v)
		}
	}
	if len(got) != len(want) || s.Lost != 0 || s.Effects != 209 || s.Reconciliation != 1 || s.DeadLetters != 1 {
		t.Fatalf("summary %+v", s)
	}
}
