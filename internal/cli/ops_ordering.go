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

func newBlockedKeysCmd(g *globals) *cobra.Command {
	var o ops.BlockedOptions
	var asJSON, check bool
	var maxBlocked time.Duration
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
operator. Nothing is changed.

For cron and monitoring, --check exits 3 when a listed key has been blocked
longer than --max-blocked (default 15m): its oldest waiting effect was
enqueued longer ago than that. It names those keys on stderr. Keys are listed
longest waiting first, so --limit never hides one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if check && maxBlocked <= 0 {
				return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--max-blocked must be positive, got %s", maxBlocked)}
			}
			var res *ops.BlockedResult
			err := report(cmd, g, asJSON, func(ctx context.Context, pool *pgxpool.Pool) (*ops.BlockedResult, error) {
				var err error
				res, err = ops.BlockedKeys(ctx, pool, o)
				return res, err
			}, func(res *ops.BlockedResult) error { return printBlocked(g, res) })
			if err != nil || !check {
				return err
			}
			var over []string
			for _, k := range res.Keys {
				if k.OldestWaitingSeconds > maxBlocked.Seconds() {
					over = append(over, fmt.Sprintf("%s/%s (%s)", k.Queue, k.OrderingKey, age(k.OldestWaitingSeconds)))
				}
			}
			if len(over) > 0 {
				return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("%d key(s) blocked longer than %s: %s",
					len(over), maxBlocked, strings.Join(over, ", "))}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Queue, "queue", "", "only this queue (default: every queue)")
	cmd.Flags().BoolVar(&o.StuckOnly, "stuck", false, "only keys held by a dead letter or a reconciliation record")
	cmd.Flags().IntVar(&o.Limit, "limit", ops.BlockedLimitDefault, "list at most this many keys")
	cmd.Flags().BoolVar(&check, "check", false, "exit 3 when a key has been blocked longer than --max-blocked")
	cmd.Flags().DurationVar(&maxBlocked, "max-blocked", ops.BlockedMaxDefault,
		"with --check, how long a key may wait (age of its oldest waiting effect)")
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
