package cli

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// newReadinessCmd is the `readiness` group. `readiness broker` lives here;
// the record projection adds `readiness projection` to the same group.
func newReadinessCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "readiness",
		Short: "Decide when to turn on a scale path",
	}
	cmd.AddCommand(newReadinessBrokerCmd(g), newReadinessProjectionCmd(g))
	return cmd
}

func newReadinessBrokerCmd(g *globals) *cobra.Command {
	var o ops.BrokerOptions
	var check, asJSON bool
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Say whether an external broker (NATS JetStream) is warranted, from the persisted samples",
		Long: `broker reads the aggregate samples workers persist every 10 s (pgoutbox.samples)
over the last --window (15m) and checks the external-broker triggers, each in
every one-minute bucket: claim latency p99 above 250ms (per queue), oldest
available age above 30s while the queue's workers are healthy (per queue), and
throughput above 500 effects/s (all queues). A trigger persisted when it held in
every sampled bucket; the answer names it and its values. With fewer than 80 %
of the buckets sampled it says so instead of guessing. PostgreSQL stays the
default. --check exits 3 when a trigger persisted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				rep, err := ops.BrokerReadiness(ctx, pool, o)
				if err != nil {
					return err
				}
				if asJSON {
					err = writeJSON(g.stdout, rep)
				} else {
					err = printBroker(g, rep)
				}
				if err != nil {
					return err
				}
				if check && rep.Decision == ops.DecisionConsiderBroker {
					return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("an external-broker trigger persisted")}
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Queue, "queue", "", "only this queue (compared literally)")
	f.DurationVar(&o.Window, "window", ops.BrokerWindowDefault, "how far back to read samples")
	f.DurationVar(&o.ClaimLatency, "claim-latency", ops.BrokerClaimLatencyDefault, "claim latency p99 trigger")
	f.DurationVar(&o.OldestAge, "oldest-age", ops.BrokerOldestAgeDefault, "oldest available age trigger")
	f.Float64Var(&o.Throughput, "throughput", ops.BrokerThroughputDefault, "throughput trigger, effects/s over all queues")
	f.BoolVar(&check, "check", false, "exit 3 when a trigger persisted")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printBroker(g *globals, rep *ops.BrokerReport) error {
	fmt.Fprintf(g.stdout, "samples: %d, in %d of the %d buckets (%s each) of the last %s; %d needed\n",
		rep.Samples, rep.BucketsSampled, rep.BucketsInWindow, age(rep.BucketSeconds), age(rep.WindowSeconds), rep.BucketsRequired)
	if len(rep.Triggers) > 0 {
		tw := newTable(g.stdout)
		row(tw, "TRIGGER", "SCOPE", "THRESHOLD", "BREACHING", "MIN", "MAX", "LATEST", "VERDICT")
		for _, t := range rep.Triggers {
			v := func(x float64) string {
				if t.Unit == "seconds" {
					return age(x)
				}
				return fmt.Sprintf("%.1f/s", x)
			}
			verdict := "ok"
			if t.Persisted {
				verdict = "PERSISTED"
			}
			row(tw, t.Trigger, cell(t.Scope, 40), "> "+v(t.Threshold), fmt.Sprintf("%d/%d", t.Breaching, t.Buckets),
				v(t.Min), v(t.Max), v(t.Latest), verdict)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(g.stdout, "decision: %s: %s\n", rep.Decision, rep.Reason)
	return nil
}
