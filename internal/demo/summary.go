package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// QueueState counts this run's effects of one queue in one state.
type QueueState struct {
	Queue string `json:"queue"`
	State string `json:"state"`
	Count int64  `json:"count"`
}

// Summary is what the demo did. Lost must be 0: effects of this run that
// are in no final or operator-visible state after the story.
type Summary struct {
	RunID          string       `json:"run_id"`
	URL            string       `json:"url"`
	Seconds        float64      `json:"seconds"`
	Lost           int64        `json:"lost"`
	Effects        int64        `json:"effects"`
	States         []QueueState `json:"states"`
	Deliveries     int64        `json:"deliveries"`
	Retries        int64        `json:"retries"`
	DeadLetters    int64        `json:"dead_letters"`
	Reconciliation int64        `json:"reconciliation_required"`
	LagP50Ms       float64      `json:"lag_p50_ms"`
	LagP99Ms       float64      `json:"lag_p99_ms"`
	// ReconcileID is the dispatch left in reconciliation_required.
	ReconcileID int64 `json:"reconcile_id"`
	// Error is set when the story did not finish.
	Error string   `json:"error,omitempty"`
	Next  []string `json:"next"`
}

// summarize reads this run's effects from the database.
func (d *Demo) summarize(ctx context.Context, started time.Time, reconcileID int64, storyErr error) (Summary, error) {
	s := Summary{RunID: d.run, URL: d.base, Seconds: time.Since(started).Seconds(), ReconcileID: reconcileID,
		Deliveries: d.counts.deliveries.Load(), Retries: d.counts.retries.Load()}
	if storyErr != nil {
		s.Error = storyErr.Error()
	}
	counts, err := store.CountCreatedSince(ctx, d.o.Pool, d.since)
	if err != nil {
		return s, err
	}
	for _, c := range counts {
		qs := QueueState{Queue: c.Queue, State: c.State, Count: c.Count}
		s.States = append(s.States, qs)
		s.Effects += qs.Count
		switch qs.State {
		case "completed":
		case "dead_letter":
			s.DeadLetters += qs.Count
		case "reconciliation_required":
			s.Reconciliation += qs.Count
		default:
			s.Lost += qs.Count
		}
	}
	if s.LagP50Ms, s.LagP99Ms, err = store.CompletionLagSince(ctx, d.o.Pool, d.since); err != nil {
		return s, err
	}
	s.Next = d.hints(reconcileID)
	return s, nil
}

// hints are the summary's "Next, try" commands, invoked as the user started
// the binary. While the demo keeps serving they include /workers and, after
// the export line that points the CLI at the GitHub emulator, inspecting and
// resolving the reconciliation record; after --exit-when-done the emulator
// is gone, so those are left out.
func (d *Demo) hints(reconcileID int64) []string {
	bin := d.o.Command
	if bin == "" {
		bin = "pgoutbox"
	}
	next := []string{bin + " status", bin + " reconcile list"}
	if !d.o.ExitWhenDone {
		dir := d.o.KeyDir
		if dir == "" {
			dir = os.TempDir()
		}
		next = append([]string{"open " + d.base + "/workers (while the demo keeps serving)"}, next...)
		if env, err := d.GitHubEnv(dir); err == nil {
			next = append(next, "export "+strings.Join(env, " ")+"   # the GitHub emulator, for reconcile inspect and resolve",
				fmt.Sprintf("%s reconcile inspect %d", bin, reconcileID),
				fmt.Sprintf("%s reconcile resolve %d --workflow-run-id <the run inspect points at>", bin, reconcileID))
		}
	}
	return append(next, bin+" dlq list", bin+" dlq replay --queue outbox_events", bin+" alert check")
}

// Print writes the summary as a table, or as JSON.
func (s Summary) Print(w io.Writer, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Fprintf(w, "\nSummary of run %s (%.1fs)\n\n", s.RunID, s.Seconds)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSTATE\tEFFECTS")
	for _, qs := range s.States {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", qs.Queue, qs.State, qs.Count)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, kv := range [][2]string{
		{"effects", fmt.Sprint(s.Effects)},
		{"deliveries", fmt.Sprint(s.Deliveries)},
		{"retries", fmt.Sprint(s.Retries)},
		{"dead letters", fmt.Sprint(s.DeadLetters)},
		{"reconciliation required", fmt.Sprint(s.Reconciliation)},
		{"lag p50 / p99", fmt.Sprintf("%.0f ms / %.0f ms", s.LagP50Ms, s.LagP99Ms)},
		{"lost", fmt.Sprint(s.Lost)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
	}
	_ = tw.Flush()
	if s.Error != "" {
		fmt.Fprintf(w, "\nthe story did not finish: %s\n", s.Error)
	}
	fmt.Fprintf(w, "\nNext, try:\n  %s\n", strings.Join(s.Next, "\n  "))
	return nil
}
