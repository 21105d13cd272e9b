package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newCompactCmd(g *globals) *cobra.Command {
	var o ops.CompactOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "compact",
		Short: "Give the space of deleted effects back: VACUUM and REINDEX CONCURRENTLY the engine's tables",
		Long: `compact returns the space that retention freed to the operating system.
Retention deletes completed effects and autovacuum makes their space reusable,
but a table's indexes never shrink: after a burst of millions of effects they
keep their peak size. compact VACUUMs pgoutbox.effects and pgoutbox.effect_keys
(which truncates their empty tails) and rebuilds every index with REINDEX
CONCURRENTLY, which does not block enqueues, claims or completions; it waits
for the transactions running when each step starts, and builds each new index
beside the old one (so it needs that much free disk). No row is changed.

Run it after a burst has drained, not on a schedule. If it is interrupted, an
invalid index named *_ccnew may be left behind: run compact again or drop it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.CompactResult, error) {
				return ops.Compact(ctx, pool, o)
			}, func(res *ops.CompactResult) error { return printCompact(g, res) })
		},
	}
	cmd.Flags().BoolVar(&o.DryRun, "dry-run", false, "show the current sizes; rebuild nothing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printCompact(g *globals, res *ops.CompactResult) error {
	tw := newTable(g.stdout)
	if res.DryRun {
		row(tw, "RELATION", "TABLE", "SIZE")
	} else {
		row(tw, "RELATION", "TABLE", "BEFORE", "AFTER")
	}
	for _, r := range res.Relations {
		if res.DryRun {
			row(tw, r.Name, r.Table, mib(r.BytesBefore))
		} else {
			row(tw, r.Name, r.Table, mib(r.BytesBefore), mib(r.BytesAfter))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.DryRun {
		fmt.Fprintf(g.stdout, "engine tables take %s (dry run: nothing rebuilt)\n", mib(res.BytesBefore))
		return nil
	}
	fmt.Fprintf(g.stdout, "compacted %s to %s\n", mib(res.BytesBefore), mib(res.BytesAfter))
	return nil
}

// mib formats a size in MiB with two decimals.
func mib(b int64) string { return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20)) }
