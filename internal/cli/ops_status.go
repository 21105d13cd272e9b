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

func newStatusCmd(g *globals) *cobra.Command {
	var ff filterFlags
	var opts ops.StatusOptions
	var asJSON, byType bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Counts by queue and state, retrying, parked, oldest available age, lag and stalled leases",
		Long: `status prints, per queue: effects available (pending, retrying ones included),
retrying (available with attempts > 0), leased, stalled leases (held longer than
--stalled-after), dead letters, reconciliation records, completions and the lag
(enqueue to completion, p50/p99) over the last 5 minutes, and the age of the
oldest due available effect. It also shows the oldest transaction holding back
VACUUM. Ages use the database clock.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Filter = ff.f
			return report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.Snapshot, error) {
				return ops.Status(ctx, pool, opts)
			}, func(snap *ops.Snapshot) error { return printStatus(g, snap, byType) })
		},
	}
	ff.register(cmd)
	stalledAfterFlag(cmd, &opts.StalledAfter)
	cmd.Flags().BoolVar(&byType, "by-type", false, "one row per queue and effect type")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printStatus(g *globals, s *ops.Snapshot, byType bool) error {
	tw := newTable(g.stdout)
	header := []any{"QUEUE", "AVAILABLE", "RETRYING", "PARKED", "LEASED", "STALLED", "DEAD LETTER", "RECONCILIATION",
		strings.ToUpper(s.CompletedWindow), "OLDEST AVAILABLE", "LAG P50", "LAG P99"}
	line := func(name string, c ops.Counts) []any {
		return []any{name, c.Available, c.Retrying, c.Parked, c.Leased, c.StalledLeases, c.DeadLetter, c.ReconciliationRequired,
			c.CompletedRecent, age(c.OldestAvailableAgeSeconds), lag(c.LagP50Seconds), lag(c.LagP99Seconds)}
	}
	rows := s.Queues
	if byType {
		header = append([]any{header[0], "EFFECT TYPE"}, header[1:]...)
		rows = s.Types
	}
	row(tw, header...)
	for _, c := range rows {
		cells := line(c.Queue, c)
		if byType {
			cells = append([]any{cells[0], c.Type}, cells[1:]...)
		}
		row(tw, cells...)
	}
	if len(s.Queues) > 1 {
		cells := line("TOTAL", s.Total())
		if byType {
			cells = append([]any{cells[0], ""}, cells[1:]...)
		}
		row(tw, cells...)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(s.Queues) == 0 {
		_, err := g.stdout.Write([]byte("no effects\n"))
		if err != nil {
			return err
		}
	}
	for _, p := range s.Paused {
		reason := ""
		if p.Reason != "" {
			reason = ": " + p.Reason
		}
		fmt.Fprintf(g.stdout, "PAUSED %s since %s by %s%s (pgoutbox queue resume %s)\n", p.Queue,
			p.At.UTC().Format(time.RFC3339), p.By, reason, p.Queue)
	}
	_, err := g.stdout.Write([]byte("oldest transaction holding back VACUUM: " + age(s.OldestXminAgeSeconds) + "\n"))
	return err
}
