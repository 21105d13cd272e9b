package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// operator is --by, or when empty $USER, else "cli".
func operator(by string) string {
	if by != "" {
		return by
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return "cli"
}

// badInput maps ops.ErrBadInput to exit 1 (could not run, nothing changed).
func badInput(err error) error {
	if errors.Is(err, ops.ErrBadInput) {
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	return err
}

func newQueueCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Pause, resume and list paused queues",
		Long: `A paused queue keeps its effects: enqueues go on, and no claim takes them (both
lease modes and the NATS relay) until it is resumed. A delivery in progress
finishes. The pause is a row of pgoutbox.queue_pauses: it survives restarts and
holds for every process; status, the console and pgoutbox_queue_paused show it.`,
	}
	var by, reason string
	var asJSON bool
	pause := &cobra.Command{
		Use:   "pause NAME",
		Short: "Stop claims of a queue's effects (enqueues go on) until resumed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				p, err := ops.PauseQueue(ctx, pool, ops.PauseOptions{Queue: args[0], By: operator(by), Reason: reason})
				if err != nil {
					return badInput(err)
				}
				if asJSON {
					return writeJSON(g.stdout, p)
				}
				if p.Already {
					fmt.Fprintf(g.stdout, "queue %s was already paused since %s by %s; nothing changed\n", p.Queue,
						p.At.UTC().Format(time.RFC3339), p.By)
					return nil
				}
				fmt.Fprintf(g.stdout, "paused queue %s: no claim takes its effects until `pgoutbox queue resume %s`\n", p.Queue, p.Queue)
				return nil
			})
		},
	}
	pause.Flags().StringVar(&by, "by", "", "who pauses (recorded; empty: $USER, else \"cli\")")
	pause.Flags().StringVar(&reason, "reason", "", "why (recorded, shown by status and the console)")
	pause.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	resume := &cobra.Command{
		Use:   "resume NAME",
		Short: "Let a paused queue's effects be claimed again, and wake its workers",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				p, paused, err := ops.ResumeQueue(ctx, pool, ops.PauseOptions{Queue: args[0]})
				if err != nil {
					return badInput(err)
				}
				if !paused {
					return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("queue %q is not paused; nothing changed", args[0])}
				}
				fmt.Fprintf(g.stdout, "resumed queue %s (paused since %s by %s)\n", p.Queue, p.At.UTC().Format(time.RFC3339), p.By)
				return nil
			})
		},
	}
	var listJSON bool
	list := &cobra.Command{
		Use:   "paused",
		Short: "List the paused queues: since when, by whom and why",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(cmd, g, listJSON, func(ctx context.Context, pool *pgxpool.Pool) ([]ops.QueuePause, error) {
				return ops.PausedQueues(ctx, pool)
			}, func(ps []ops.QueuePause) error {
				if len(ps) == 0 {
					fmt.Fprintln(g.stdout, "no paused queue")
					return nil
				}
				tw := newTable(g.stdout)
				row(tw, "QUEUE", "PAUSED AT", "BY", "REASON")
				for _, p := range ps {
					row(tw, cell(p.Queue, 40), p.At.UTC().Format(time.RFC3339), cell(p.By, 40), cell(p.Reason, 80))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	cmd.AddCommand(pause, resume, list)
	return cmd
}

// newEffectCancelCmd is `effect cancel`.
func newEffectCancelCmd(g *globals) *cobra.Command {
	var o ops.CancelOptions
	var asJSON bool
	cancel := &cobra.Command{
		Use:   "cancel ID...",
		Short: "Discard effects that should never run (available or dead letter, delivery never started)",
		Long: `cancel completes each given effect without delivering it, recording the
cancellation (by, reason, the state it left) as its resolution. It may cancel an
available effect (due, scheduled, retrying, or waiting behind its ordering key)
and a dead letter. It refuses, and changes nothing for, a leased effect (in
delivery), one a row-lock claim is delivering right now, a reconciliation record,
and any effect whose delivery started: a non-replay-safe request may have been
sent, which only reconciliation decides. A cancelled effect releases its
ordering key. Exit 1 when any given effect was not cancelled.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.IDs, o.By = nil, operator(o.By)
			for _, a := range args {
				id, err := parseID(a)
				if err != nil {
					return err
				}
				o.IDs = append(o.IDs, id)
			}
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				res, err := ops.CancelEffects(ctx, pool, o)
				if err != nil {
					return badInput(err)
				}
				if asJSON {
					err = writeJSON(g.stdout, res)
				} else {
					verb := "cancelled"
					if res.DryRun {
						verb = "would cancel (dry run)"
					}
					for _, m := range res.Cancelled {
						fmt.Fprintf(g.stdout, "%s %d (%s, %s, was %s)\n", verb, m.ID, m.Queue, m.Type, m.State)
					}
					for _, s := range res.Skipped {
						fmt.Fprintf(g.stderr, "not cancelled: effect %d (%s): %s\n", s.ID, s.State, s.Reason)
					}
				}
				if err != nil {
					return err
				}
				if len(res.Skipped) > 0 {
					return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("%d effect(s) not cancelled", len(res.Skipped))}
				}
				return nil
			})
		},
	}
	cancel.Flags().StringVar(&o.By, "by", "", "who cancels (recorded; empty: $USER, else \"cli\")")
	cancel.Flags().StringVar(&o.Reason, "reason", "", "why (recorded in the effect's resolution)")
	cancel.Flags().BoolVar(&o.DryRun, "dry-run", false, "show what would be cancelled; change nothing")
	cancel.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cancel
}
