package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/demo"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

func TestStoryEndsInTheIntendedStates(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	d, err := demo.Start(ctx, demo.Options{Pool: pool, Out: &out, Records: 500, KeyDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	s, err := d.Story(ctx)
	metrics := scrape(t, d.URL()+"/metrics")
	workers := scrape(t, d.URL()+"/workers?format=json")
	if cerr := d.Close(ctx); cerr != nil {
		t.Errorf("close: %v", cerr)
	}
	if err != nil {
		t.Fatalf("story: %v\n%s", err, out.String())
	}
	t.Logf("story took %s (reported, not asserted)", time.Since(started))
	want := map[string]int64{
		"control_plane_jobs/completed":                 4, // installation, 2 pushes, 1 workflow_run
		"control_plane_outbox/completed":               4, // 2 check run creates, 1 dispatch, 1 check run complete
		"control_plane_outbox/reconciliation_required": 1, // the dispatch whose response was lost
	}
	for k, v := range demo.ProjectionExpectations(500) {
		want[k] = v
	}
	got := map[string]int64{}
	for _, qs := range s.States {
		got[qs.Queue+"/"+qs.State] = qs.Count
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d, want %d", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("states %v, want exactly %v", got, want)
	}
	if s.Lost != 0 || s.ReconcileID == 0 {
		t.Fatalf("lost %d, reconcile id %d", s.Lost, s.ReconcileID)
	}
	// The demo's /metrics has the database gauges (issue 17, point 8), and
	// they agree with the story's final states.
	for _, line := range []string{
		`pgoutbox_effects{effect_type="github.workflow.dispatch",queue="control_plane_outbox",state="reconciliation_required"} 1`,
		`pgoutbox_stalled_leases{effect_type="github.workflow.dispatch",queue="control_plane_outbox"} 0`,
		"\npgoutbox_oldest_xmin_age_seconds ",
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	// /workers says the demo's own workers drain the projection (issue 30:
	// it said "workers in this server: no" and "never" while they did).
	var rep console.WorkersReport
	if err := json.Unmarshal([]byte(workers), &rep); err != nil {
		t.Fatalf("/workers: %v\n%s", err, workers)
	}
	if p := rep.Projection; p == nil || !p.InProcessWorkers || p.NextDrain.At == nil || !slices.Contains(rep.Served, "outbox_events") {
		t.Errorf("/workers does not say this process drains the projection: %s", workers)
	}
	var table bytes.Buffer
	if err := s.Print(&table, false); err != nil || !strings.Contains(table.String(), "reconcile inspect") {
		t.Fatalf("summary table: %v\n%s", err, table.String())
	}
	// The hint that needs the GitHub emulator comes after the export line
	// that points the CLI at it (issue 30).
	if exp, insp := strings.Index(table.String(), "export GITHUB_API_URL="), strings.Index(table.String(), "pgoutbox reconcile inspect"); exp < 0 || exp > insp {
		t.Fatalf("summary: the export line (at %d) must come before reconcile inspect (at %d):\n%s", exp, insp, table.String())
	}
}

// scrape GETs url and returns the body of a 200 answer.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}
