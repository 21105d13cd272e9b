package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newBlockedKeysCmd(g *globals) *cobra.Command {
	var o ops.BlockedOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "blocked-keys",
		Short: "List ordering keys whose effects wait behind an earlier one, and what blocks them",
		Long: `blocked-keys lists the ordering keys (Effect.OrderingKey) that have effects
waiting behind an earlier effect of the same queue and key, longest waiting
first, with that head effect: in delivery (leased), retrying or scheduled
(available, not yet due), a strict dead letter (replay it with dlq replay) or a
reconciliation record (resolve it with reconcile). The key's later effects are
delivered, in order, once the head is completed (or, for a dead letter whose
type moves on, at once). --stuck lists only the keys that wait for an
operator. Nothing is changed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.BlockedResult, error) {
				return ops.BlockedKeys(ctx, pool, o)
			}, func(res *ops.BlockedResult) error { return printBlocked(g, res) })
		},
	}
	cmd.Flags().StringVar(&o.Queue, "queue", "", "only this queue (default: every queue)")
	cmd.Flags().BoolVar(&o.StuckOnly, "stuck", false, "only keys held by a dead letter or a reconciliation record")
	cmd.Flags().IntVar(&o.Limit, "limit", ops.BlockedLimitDefault, "list at most this many keys")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printBlocked(g *globals, res *ops.BlockedResult) error {
	if len(res.Keys) > 0 {
		tw := newTable(g.stdout)
		row(tw, "QUEUE", "ORDERING KEY", "WAITING", "OLDEST", "HEAD ID", "HEAD TYPE", "HEAD", "ATTEMPTS")
		for _, k := range res.Keys {
			row(tw, cell(k.Queue, 40), cell(k.OrderingKey, 60), k.Waiting, age(k.OldestWaitingSeconds), k.HeadID,
				cell(k.HeadType, 40), k.Reason, k.HeadAttempts)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(g.stdout, "%d blocked key(s), %d waiting for an operator\n", len(res.Keys), res.Stuck)
	return nil
}
