package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func newReconcileCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Resolve workflow dispatches whose outcome is unknown (reconciliation_required)",
		Long: `A workflow dispatch is never sent twice automatically. When its outcome is unknown
(timeout or reset after sending, 5xx, a crash after the start was recorded), it
waits in reconciliation_required for an operator:

  pgoutbox reconcile list                       what is waiting
  pgoutbox reconcile inspect ID                 the workflow runs that may be it (changes nothing)
  pgoutbox reconcile resolve ID --workflow-run-id N   the run exists (checked on GitHub): complete the record
  pgoutbox reconcile supersede ID --reason TEXT       no run exists: dispatch a new attempt`,
	}
	var asJSON bool
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List dispatches in reconciliation_required: repository, release run, attempt",
		Long: `list shows each reconciliation record of the control plane's queue, oldest first:
its id, effect type, subject (repository, release run, execution attempt id and
its number, read from those payload keys only; --json: "subject", and the
decoded "dispatch"), when its delivery started and its last error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			app, closeApp, err := g.operatorApp(cmd.Context(), false)
			if err != nil {
				return err
			}
			defer closeApp()
			if limit <= 0 {
				return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--limit must be positive, got %d", limit)}
			}
			ps, err := app.ListPending(cmd.Context(), limit)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			items := make([]pendingItem, len(ps))
			for i, p := range ps {
				items[i] = pendingItem{Pending: p, Subject: ops.ParseSubject(p.Payload)}
			}
			if asJSON {
				return writeJSON(g.stdout, items)
			}
			if len(items) == 0 {
				fmt.Fprintln(g.stdout, "nothing to reconcile")
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTYPE\tREPOSITORY\tRELEASE RUN\tATTEMPT\tSTARTED\tLAST ERROR")
			for _, p := range items {
				started := "-"
				if p.DeliveryStartedAt != nil {
					started = age(time.Since(*p.DeliveryStartedAt).Seconds()) + " ago"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", p.ID, p.Type, cell(p.Subject.Repository, 60),
					orDash(p.Subject.ReleaseRunID), attemptCell(p.Subject), started, cell(p.LastError, 60))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	list.Flags().IntVar(&limit, "limit", 100, "most records listed")

	inspect := &cobra.Command{
		Use:   "inspect ID",
		Short: "List the workflow runs that may be this dispatch's; changes nothing",
		Args:  cobra.ExactArgs(1),
		RunE: g.onRecord(true, func(ctx context.Context, app *controlplane.App, id int64) error {
			in, err := app.Inspect(ctx, id)
			if err != nil {
				return reconcileErr(err)
			}
			if asJSON {
				return writeJSON(g.stdout, in)
			}
			d := in.Pending.Dispatch
			fmt.Fprintf(g.stdout, "dispatch %d: %s %s on %s, release run %d attempt %d\n", id, d.Repository, d.Workflow, d.Ref,
				d.ReleaseRunID, d.ExecutionAttemptID)
			fmt.Fprintf(g.stdout, "workflow runs created since %s (run name %q):\n", in.Since.UTC().Format(time.RFC3339),
				controlplane.RunName(d.ReleaseRunID, d.ExecutionAttemptID))
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\tRUN ID\tRUN NAME\tSTATUS\tCONCLUSION\tCREATED")
			for _, c := range in.Candidates {
				mark := ""
				if c.Matches {
					mark = "→"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", mark, c.WorkflowRunID, c.DisplayTitle, c.Status, c.Conclusion,
					c.CreatedAt.UTC().Format(time.RFC3339))
			}
			_ = tw.Flush()
			fmt.Fprintln(g.stdout, "next:", in.Suggestion)
			return nil
		}),
	}
	inspect.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var runID int64
	var force bool
	resolve := &cobra.Command{
		Use:   "resolve ID --workflow-run-id N",
		Short: "The run exists: complete the record and advance the attempt (checked against GitHub)",
		Long: `resolve records that the dispatch did create workflow run N: the record is
completed and the execution attempt advances to dispatched with that run.

First it asks GitHub for run N in the dispatch's repository and refuses (exit 3,
nothing changed) a run that does not exist there, that is a run of another
workflow, that another event than workflow_dispatch triggered, that ran on
another commit than the release run's, or whose name is not the attempt's
("release R attempt A"); an attempt that already records another run is
refused too. This
needs the GitHub App settings (GITHUB_APP_ID, GITHUB_APP_PRIVATE_KEY or
GITHUB_APP_PRIVATE_KEY_FILE, GITHUB_API_URL). --force skips the check, for
when GitHub cannot be asked or the workflow names its runs otherwise; the
resolution then records "verified": false.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			// The record is checked before GitHub is needed: a missing App
			// setting is reported (ErrNoGitHub) only for a real record.
			if err := g.checkPending(cmd.Context(), id, cmd.Name()); err != nil {
				return err
			}
			var gh controlplane.GitHub
			if !force {
				client, missing, err := githubClient()
				if err != nil {
					return &ExitError{Code: ExitCouldNotRun, Err: err}
				}
				if missing == "" {
					gh = client
				}
			}
			app, closeApp, err := g.operatorAppWith(cmd.Context(), gh)
			if err != nil {
				return err
			}
			defer closeApp()
			how := "checked against GitHub"
			if force {
				err, how = app.ResolveUnverified(cmd.Context(), id, runID), "not checked: --force"
			} else {
				err = app.Resolve(cmd.Context(), id, runID)
			}
			if err != nil {
				return reconcileErr(err)
			}
			fmt.Fprintf(g.stdout, "resolved %d: workflow run %d recorded (%s), record completed\n", id, runID, how)
			return nil
		},
	}
	resolve.Flags().Int64Var(&runID, "workflow-run-id", 0, "the workflow run that the dispatch created (required)")
	resolve.Flags().BoolVar(&force, "force", false, "do not check the run against GitHub")
	_ = resolve.MarkFlagRequired("workflow-run-id")

	var reason string
	supersede := &cobra.Command{
		Use:   "supersede ID --reason TEXT",
		Short: "No run exists: close the record and dispatch a new execution attempt",
		Args:  cobra.ExactArgs(1),
		RunE: g.onRecord(false, func(ctx context.Context, app *controlplane.App, id int64) error {
			s, err := app.Supersede(ctx, id, reason)
			if err != nil {
				return reconcileErr(err)
			}
			fmt.Fprintf(g.stdout, "superseded %d: release run %d attempt %d (number %d) dispatched\n", id, s.ReleaseRunID,
				s.ExecutionAttemptID, s.AttemptNumber)
			return nil
		}),
	}
	supersede.Flags().StringVar(&reason, "reason", "", "why no run exists (required; recorded)")
	_ = supersede.MarkFlagRequired("reason")

	cmd.AddCommand(list, inspect, resolve, supersede)
	return cmd
}

// onRecord is the RunE of a subcommand acting on one reconciliation record:
// it parses the ID argument, opens the operator's application (with a GitHub
// client when needGitHub) and runs fn.
func (g *globals) onRecord(needGitHub bool, fn func(ctx context.Context, app *controlplane.App, id int64) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		id, err := parseID(args[0])
		if err != nil {
			return err
		}
		if err := g.checkPending(cmd.Context(), id, cmd.Name()); err != nil {
			return err
		}
		app, closeApp, err := g.operatorApp(cmd.Context(), needGitHub)
		if err != nil {
			return err
		}
		defer closeApp()
		return fn(cmd.Context(), app, id)
	}
}

// checkPending says, before the GitHub App settings are needed, why id is not
// a dispatch awaiting reconciliation: no such effect (exit 1), a completed
// dispatch, resolved, superseded or delivered (inspect: exit 0 with a note;
// resolve and supersede: exit 1, nothing changed), or an effect in another
// state or of another type (exit 3, nothing changed). nil: it is one.
func (g *globals) checkPending(ctx context.Context, id int64, verb string) error {
	pool, _, err := g.open(ctx, false)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, ok, err := pgoutbox.GetEffect(ctx, pool, id)
	switch {
	case err != nil:
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	case !ok:
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("no effect %d (never enqueued, or pruned after its retention)", id)}
	case r.Type != controlplane.TypeWorkflowDispatch:
		return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("effect %d is a %s, not a %s: nothing to reconcile, nothing changed",
			id, r.Type, controlplane.TypeWorkflowDispatch)}
	case r.State == pgoutbox.StateReconciliationRequired:
		return nil
	case r.State == pgoutbox.StateCompleted && verb == "inspect":
		fmt.Fprintf(g.stdout, "dispatch %d is completed (resolved, superseded or delivered): nothing to reconcile; "+
			"pgoutbox reconcile list shows what is left\n", id)
		return &ExitError{Code: ExitOK}
	case r.State == pgoutbox.StateCompleted:
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("dispatch %d is completed (resolved, superseded or delivered): nothing changed", id)}
	default:
		return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("effect %d is %s, not reconciliation_required: nothing changed%s",
			id, r.State, stateHint(r.State))}
	}
}

// stateHint names the command for an effect that is not a reconciliation record.
func stateHint(s pgoutbox.State) string {
	if s == pgoutbox.StateDeadLetter {
		return " (a dead letter: pgoutbox dlq replay --id)"
	}
	return ""
}

func reconcileErr(err error) error {
	if errors.Is(err, controlplane.ErrNotFound) || errors.Is(err, controlplane.ErrRunMismatch) {
		return &ExitError{Code: ExitCheckFailed, Err: err}
	}
	return &ExitError{Code: ExitCouldNotRun, Err: err}
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("invalid id %q", s)}
	}
	return id, nil
}

// pendingItem is one line of `reconcile list`: the record and its subject.
type pendingItem struct {
	controlplane.Pending
	Subject ops.Subject `json:"subject"`
}

func orDash(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

// attemptCell is "ID (#N)", "ID", or "-".
func attemptCell(s ops.Subject) string {
	switch {
	case s.ExecutionAttemptID != 0 && s.AttemptNumber != 0:
		return fmt.Sprintf("%d (#%d)", s.ExecutionAttemptID, s.AttemptNumber)
	case s.ExecutionAttemptID != 0:
		return strconv.FormatInt(s.ExecutionAttemptID, 10)
	}
	return "-"
}
