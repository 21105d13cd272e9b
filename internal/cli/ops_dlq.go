package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List and replay dead letters",
	}
	cmd.AddCommand(newDLQListCmd(g), newDLQReplayCmd(g))
	return cmd
}

func newDLQListCmd(g *globals) *cobra.Command {
	var ff filterFlags
	var afterID int64
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters by id: queue, type, subject, attempts, last error, when (never the payload)",
		Long: `list shows each dead letter's id, queue, effect type, subject, attempts, when it
was dead-lettered and its last error. The subject names what the effect is about,
from a fixed set of payload keys and never any other: record_id (the projection's
record), repository, release_run_id, execution_attempt_id, attempt_number and
workflow_run_id (the control plane's); "-" when the payload has none. The
payload itself is never shown.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.DeadLetterPage, error) {
				return ops.ListDeadLetters(ctx, pool, ff.f, afterID, limit)
			}, func(page *ops.DeadLetterPage) error { return printDeadLetters(g, page) })
		},
	}
	ff.register(cmd)
	cmd.Flags().Int64Var(&afterID, "after-id", 0, "list dead letters with an id above this (the next page)")
	cmd.Flags().IntVar(&limit, "limit", ops.ListLimitDefault, "page size")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printDeadLetters(g *globals, page *ops.DeadLetterPage) error {
	tw := newTable(g.stdout)
	row(tw, "ID", "QUEUE", "EFFECT TYPE", "SUBJECT", "ATTEMPTS", "DEAD-LETTERED AT", "LAST ERROR")
	for _, d := range page.Items {
		at := "-"
		if d.DeadLetteredAt != nil {
			at = d.DeadLetteredAt.UTC().Format(time.RFC3339)
		}
		row(tw, d.ID, cell(d.Queue, 40), cell(d.Type, 40), cell(d.Subject.String(), 80),
			fmt.Sprintf("%d/%d", d.Attempts, d.MaxAttempts), at, cell(d.LastError, 100))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(page.Items) == 0 {
		fmt.Fprintln(g.stdout, "no dead letters")
	}
	if page.NextAfterID != nil {
		fmt.Fprintf(g.stdout, "more: pgoutbox dlq list --after-id %d\n", *page.NextAfterID)
	}
	return nil
}

func newDLQReplayCmd(g *globals) *cobra.Command {
	var o ops.ReplayOptions
	var ff filterFlags
	var all, asJSON bool
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Move dead letters back to available with fresh attempts (never reconciliation records)",
		Long: `replay moves dead letters back to available with attempts reset to 0, oldest id
first, at most --limit per run (OUTBOX_REPLAY_BATCH_LIMIT, default 100), and
wakes their workers. Select them with --id (repeatable), --queue and
--effect-type, or replay every queue with --all. Only dead letters move: an
effect in reconciliation_required is never replayed (resolve it with
pgoutbox reconcile); asking for one by --id reports it and exits 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Filter, o.By = ff.f, operator(o.By)
			if !all && len(o.IDs) == 0 && o.Filter == (ops.Filter{}) {
				return &ExitError{Code: ExitCouldNotRun,
					Err: fmt.Errorf("say which dead letters to replay: --id, --queue, --effect-type, or --all")}
			}
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				res, err := ops.ReplayDeadLetters(ctx, pool, o)
				if err != nil {
					return err
				}
				if asJSON {
					err = writeJSON(g.stdout, res)
				} else {
					err = printReplay(g, res)
				}
				if err != nil {
					return err
				}
				if len(res.Skipped) > 0 {
					return &ExitError{Code: ExitCouldNotRun,
						Err: fmt.Errorf("%d requested effect(s) not replayed", len(res.Skipped))}
				}
				if len(res.Replayed) == 0 && len(o.IDs) == 0 && o.Filter != (ops.Filter{}) {
					return unknownFilter(ctx, pool, o.Filter)
				}
				return nil
			})
		},
	}
	ff.register(cmd)
	cmd.Flags().Int64SliceVar(&o.IDs, "id", nil, "replay this effect (repeatable, or comma-separated)")
	cmd.Flags().BoolVar(&all, "all", false, "replay dead letters of every queue and type")
	cmd.Flags().IntVar(&o.Limit, "limit", envInt("OUTBOX_REPLAY_BATCH_LIMIT", ops.ReplayBatchLimitDefault),
		"replay at most this many (env OUTBOX_REPLAY_BATCH_LIMIT)")
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "show what would be replayed; change nothing")
	cmd.Flags().StringVar(&o.By, "by", "", "who replays, named in each effect's history (empty: $USER, else \"cli\")")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// unknownFilter refuses (exit 1) a --queue or --effect-type that matches no
// effect at all, in any state: most often a misspelt name, which must not
// read as "replayed 0" and exit 0. A filter that matches effects but no dead
// letters is not an error.
func unknownFilter(ctx context.Context, pool *pgxpool.Pool, f ops.Filter) error {
	snap, err := ops.Status(ctx, pool, ops.StatusOptions{Filter: f})
	if err != nil || len(snap.Queues) > 0 {
		return err
	}
	what := []string{}
	if f.Queue != "" {
		what = append(what, fmt.Sprintf("queue %q", f.Queue))
	}
	if f.Type != "" {
		what = append(what, fmt.Sprintf("effect type %q", f.Type))
	}
	return &ExitError{Code: ExitCouldNotRun,
		Err: fmt.Errorf("no effects of %s in any state (pgoutbox status lists the queues)", strings.Join(what, " and "))}
}

func printReplay(g *globals, res *ops.ReplayResult) error {
	if len(res.Replayed) > 0 {
		tw := newTable(g.stdout)
		// A dry run rolls its moves back: what the rows are now is a dead
		// letter, and what they would become is the moved state.
		state := func(m ops.Moved) string { return m.State }
		if res.DryRun {
			state = func(m ops.Moved) string { return "dead_letter → " + m.State }
		}
		row(tw, "ID", "QUEUE", "EFFECT TYPE", "STATE")
		for _, m := range res.Replayed {
			row(tw, m.ID, cell(m.Queue, 40), cell(m.Type, 40), state(m))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	verb := "replayed"
	if res.DryRun {
		verb = "would replay (dry run)"
	}
	fmt.Fprintf(g.stdout, "%s %d dead letter(s)", verb, len(res.Replayed))
	if len(res.Replayed) == res.Limit {
		fmt.Fprintf(g.stdout, "; the batch limit (%d) was reached, run again for more", res.Limit)
	}
	fmt.Fprintln(g.stdout)
	for _, s := range res.Skipped {
		fmt.Fprintf(g.stderr, "not replayed: effect %d (%s): %s\n", s.ID, s.State, s.Reason)
	}
	return nil
}
