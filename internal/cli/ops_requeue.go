package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newRequeueStaleCmd(g *globals) *cobra.Command {
	var o ops.RequeueOptions
	var ff filterFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "requeue-stale",
		Short: "Recover leases stalled past OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, with the sweeper's routing",
		Long: `requeue-stale recovers leases taken longer ago than --stalled-after
(OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, default 10; lease extension does not
reset this age), as the sweeper would: back to available, to dead_letter when
attempts are exhausted, and to reconciliation_required when the effect is not
replay-safe and its delivery started — never back to available. The stalled
worker's lease token is cleared, so its late writes change nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Filter = ff.f
			return report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.RequeueResult, error) {
				return ops.RequeueStale(ctx, pool, o)
			}, func(res *ops.RequeueResult) error { return printRequeue(g, res) })
		},
	}
	ff.register(cmd)
	stalledAfterFlag(cmd, &o.StalledAfter)
	cmd.Flags().IntVar(&o.Limit, "limit", ops.RequeueLimitDefault, "recover at most this many leases")
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "show what would be recovered; change nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printRequeue(g *globals, res *ops.RequeueResult) error {
	byState := map[string]int{}
	if len(res.Requeued) > 0 {
		tw := newTable(g.stdout)
		row(tw, "ID", "QUEUE", "EFFECT TYPE", "LEASE OWNER", "HELD FOR", "NOW")
		for _, m := range res.Requeued {
			row(tw, m.ID, cell(m.Queue, 40), cell(m.Type, 40), cell(m.LeaseOwner, 40), age(m.LeaseHeldSeconds), m.State)
			byState[m.State]++
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	verb := "requeued"
	if res.DryRun {
		verb = "would requeue (dry run)"
	}
	parts := make([]string, 0, len(byState))
	for st, n := range byState {
		parts = append(parts, fmt.Sprintf("%d %s", n, st))
	}
	sort.Strings(parts)
	fmt.Fprintf(g.stdout, "%s %d stalled lease(s) held longer than %s", verb, len(res.Requeued), age(res.StalledAfterSeconds))
	if len(parts) > 0 {
		fmt.Fprintf(g.stdout, ": %s", strings.Join(parts, ", "))
	}
	fmt.Fprintln(g.stdout)
	return nil
}
