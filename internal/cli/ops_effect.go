package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newEffectCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "effect",
		Short: "Show one effect's history, or cancel effects",
	}
	cmd.AddCommand(newEffectHistoryCmd(g), newEffectCancelCmd(g))
	return cmd
}

func newEffectHistoryCmd(g *globals) *cobra.Command {
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history ID",
		Short: "One effect's timeline: enqueue, each failed attempt, replays, operators' actions, outcome",
		Long: `history prints one effect's timeline, oldest first, as the console's effect page
shows it: when it was enqueued, each recorded failed attempt with its worker and
error (pgoutbox.effect_attempts), each replay, the latest claim, the delivery's
start, its outcome (completed, dead-lettered, reconciliation required), and the
console actions that named it (replay, cancel, resolve, supersede) with the operator's
name (pgoutbox.console_audit). Errors and a recorded resolution are redacted
like the console's; the payload is never shown. It changes nothing.

Exit status: 0 when the effect exists, 1 when no effect has that id (a completed
effect is gone once pruned) or the database cannot be read.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil || id <= 0 {
				return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("invalid effect id %q: want a positive integer", args[0])}
			}
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				h, found, err := ops.EffectHistory(ctx, pool, id, limit)
				if err != nil {
					return err
				}
				if !found {
					return &ExitError{Code: ExitCouldNotRun,
						Err: fmt.Errorf("no effect %d (never enqueued, or completed and pruned since)", id)}
				}
				redactHistory(h)
				if asJSON {
					return writeJSON(g.stdout, h)
				}
				return printHistory(g, h)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", ops.HistoryAttemptsDefault, "most recorded attempts and console actions shown (the newest)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// redactHistory applies the console's redaction to everything of h an
// operator is shown that may carry a credential: errors, operators'
// recorded outcomes and the resolution.
func redactHistory(h *ops.History) {
	h.LastError = console.RedactError(h.LastError)
	for i := range h.Events {
		h.Events[i].Detail = console.RedactError(h.Events[i].Detail)
	}
	if h.Resolution != nil {
		h.Resolution = []byte(console.RedactPayload(h.Resolution))
	}
}

func printHistory(g *globals, h *ops.History) error {
	fmt.Fprintf(g.stdout, "effect %d: queue %s, type %s, key %s; %s after %d of %d attempts\n",
		h.ID, cell(h.Queue, 200), cell(h.Type, 200), cell(h.Key, 200), h.State, h.Attempts, h.MaxAttempts)
	if h.Cut {
		fmt.Fprintln(g.stdout, "(older attempts or actions are left out; --limit shows more)")
	}
	tw := newTable(g.stdout)
	row(tw, "AT", "EVENT", "BY", "DETAIL")
	for _, e := range h.Events {
		by := e.Worker
		if e.Operator != "" {
			by = e.Operator
		}
		row(tw, e.At.UTC().Format("2006-01-02T15:04:05.000Z"), cell(e.What, 200), cell(by, 80), cell(e.Detail, 300))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if h.Resolution != nil {
		fmt.Fprintf(g.stdout, "resolution: %s\n", cell(string(h.Resolution), 2000))
	}
	return nil
}
