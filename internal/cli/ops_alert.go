package cli

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newAlertCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "alert",
		Short: "Alert rules over the outbox",
	}
	cmd.AddCommand(newAlertCheckCmd(g))
	return cmd
}

// alertOutput is `alert check --json`.
type alertOutput struct {
	*ops.AlertReport
	Webhook webhookOutcome `json:"webhook"`
}

type webhookOutcome struct {
	// Configured: OUTBOX_ALERT_WEBHOOK_URL is set (its value is never shown).
	Configured bool   `json:"configured"`
	Posted     bool   `json:"posted"`
	Error      string `json:"error,omitempty"`
}

func newAlertCheckCmd(g *globals) *cobra.Command {
	var ff filterFlags
	var t ops.Thresholds
	var stalledAfter, webhookTimeout time.Duration
	var failOnAlert, asJSON bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Evaluate the alert rules; POST to OUTBOX_ALERT_WEBHOOK_URL on a breach",
		Long: `check evaluates each rule and prints its value, threshold and verdict. A rule
fires when its value reaches its threshold (value >= threshold); a threshold of
0 disables it. Rules: dead letters (OUTBOX_DLQ_ALERT_THRESHOLD, 1), retrying
effects (OUTBOX_RETRY_ALERT_THRESHOLD, 50), pending = available effects
(OUTBOX_PENDING_ALERT_THRESHOLD, 200), age of the oldest due available effect
(OUTBOX_PENDING_MAX_AGE_MINUTES, 15), any reconciliation_required record, the
age of the oldest transaction holding back VACUUM (OUTBOX_XMIN_MAX_AGE_MINUTES,
5; seeing other roles' sessions needs pg_monitor), and any lease held longer
than --stalled-after (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, 10: a worker
that hangs; recover with requeue-stale).

When a rule fires and OUTBOX_ALERT_WEBHOOK_URL is set, a JSON alert is POSTed
to it (bounded by --webhook-timeout); a failed POST is reported on stderr and
does not change the exit code. The exit code is 0 unless --fail-on-alert
(OUTBOX_ALERT_FAIL_ON_ALERT=1) is set and a rule fires: then 3.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stalledAfter <= 0 {
				return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--stalled-after must be positive, got %s", stalledAfter)}
			}
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				snap, err := ops.Status(ctx, pool, ops.StatusOptions{Filter: ff.f, StalledAfter: stalledAfter})
				if err != nil {
					return err
				}
				rep := ops.Evaluate(snap, t)
				out := alertOutput{AlertReport: rep}
				url := os.Getenv("OUTBOX_ALERT_WEBHOOK_URL")
				out.Webhook.Configured = url != ""
				if rep.Firing && url != "" {
					if err := ops.PostAlert(ctx, nil, url, rep, webhookTimeout); err != nil {
						out.Webhook.Error = err.Error()
						fmt.Fprintf(g.stderr, "pgoutbox: %v (the check itself ran)\n", err)
					} else {
						out.Webhook.Posted = true
					}
				}
				if asJSON {
					err = writeJSON(g.stdout, out)
				} else {
					err = printAlert(g, out)
				}
				if err != nil {
					return err
				}
				if rep.Firing && failOnAlert {
					return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("%d alert rule(s) firing", len(rep.FiringRules()))}
				}
				return nil
			})
		},
	}
	ff.register(cmd)
	f := cmd.Flags()
	f.Int64Var(&t.DeadLetters, "dlq-threshold", int64(envInt("OUTBOX_DLQ_ALERT_THRESHOLD", ops.DeadLetterThresholdDefault)),
		"fire at this many dead letters (env OUTBOX_DLQ_ALERT_THRESHOLD)")
	f.Int64Var(&t.Retrying, "retry-threshold", int64(envInt("OUTBOX_RETRY_ALERT_THRESHOLD", ops.RetryingThresholdDefault)),
		"fire at this many retrying effects (env OUTBOX_RETRY_ALERT_THRESHOLD)")
	f.Int64Var(&t.Pending, "pending-threshold", int64(envInt("OUTBOX_PENDING_ALERT_THRESHOLD", ops.PendingThresholdDefault)),
		"fire at this many available effects (env OUTBOX_PENDING_ALERT_THRESHOLD)")
	f.DurationVar(&t.PendingMaxAge, "pending-max-age", envMinutes("OUTBOX_PENDING_MAX_AGE_MINUTES", ops.PendingMaxAgeDefault),
		"fire when the oldest due available effect is this old (env OUTBOX_PENDING_MAX_AGE_MINUTES, in minutes)")
	f.DurationVar(&t.XminMaxAge, "xmin-max-age", envMinutes("OUTBOX_XMIN_MAX_AGE_MINUTES", ops.XminMaxAgeDefault),
		"fire when a transaction has held back VACUUM this long (env OUTBOX_XMIN_MAX_AGE_MINUTES, in minutes)")
	stalledAfterFlag(cmd, &stalledAfter)
	f.BoolVar(&failOnAlert, "fail-on-alert", os.Getenv("OUTBOX_ALERT_FAIL_ON_ALERT") == "1",
		"exit 3 when a rule fires (env OUTBOX_ALERT_FAIL_ON_ALERT=1)")
	f.DurationVar(&webhookTimeout, "webhook-timeout", ops.WebhookTimeoutDefault,
		"bound on the POST to OUTBOX_ALERT_WEBHOOK_URL")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printAlert(g *globals, out alertOutput) error {
	tw := newTable(g.stdout)
	row(tw, "RULE", "VALUE", "THRESHOLD", "VERDICT")
	for _, r := range out.Rules {
		value, threshold := fmt.Sprintf("%.0f", r.Value), fmt.Sprintf(">= %.0f", r.Threshold)
		if r.Unit == "seconds" {
			value, threshold = age(r.Value), ">= "+age(r.Threshold)
		}
		verdict := "ok"
		switch {
		case r.Disabled:
			verdict, threshold = "disabled", "-"
		case r.Firing:
			verdict = "ALERT"
		}
		row(tw, r.Rule, value, threshold, verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case !out.Firing:
		fmt.Fprintln(g.stdout, "no alert")
	case out.Webhook.Posted:
		fmt.Fprintf(g.stdout, "%d rule(s) firing; alert posted to OUTBOX_ALERT_WEBHOOK_URL\n", len(out.FiringRules()))
	default:
		fmt.Fprintf(g.stdout, "%d rule(s) firing\n", len(out.FiringRules()))
	}
	return nil
}
