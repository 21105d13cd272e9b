package cli

// The record projection's commands: `projector once|drain` and
// `readiness projection` (package projection).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/projection"
)

// ReadinessOutputDefault is where `readiness projection` writes its result,
// relative to the working directory.
const ReadinessOutputDefault = "artifacts/launch/projection-readiness-latest.json"

// projectorApp builds the projection from the environment for a command.
func projectorApp(g *globals, pool *pgxpool.Pool) (*projection.App, projection.Config, error) {
	cfg, err := projection.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(g.stderr, "pgoutbox:", err)
	}
	cfg.Logger = g.logger()
	app, err := projection.New(pool, cfg)
	return app, cfg, err
}

func noTargetMessage(cfg projection.Config) string {
	return fmt.Sprintf("no projection target is enabled (solr: %s; graphdb: %s); nothing claimed",
		cfg.Disabled[projection.TargetSolr], cfg.Disabled[projection.TargetGraphDB])
}

func newProjectorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "projector",
		Short: "Project records to Solr and the graph store by hand (once or until drained)",
		Long: `projector delivers the record projection's effects (queue outbox_events,
type record.upsert) to the enabled targets (OUTBOX_PROJECT_TO_SOLR=1,
OUTBOX_PROJECT_TO_GRAPHDB=1), claiming them under leases like the workers of
serve do, so it is safe to run next to them. With no target enabled it claims
nothing. State names: pending = available, processing = leased, retry =
available with attempts > 0, processed = completed.`,
	}
	var batch, maxBatches int
	var asJSON, noProgress bool
	run := func(drain bool) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, _ []string) error {
			return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
				app, cfg, err := projectorApp(g, pool)
				if err != nil {
					return err
				}
				if !app.Enabled() {
					if asJSON {
						return writeJSON(g.stdout, map[string]any{"status": "no_target", "message": noTargetMessage(cfg), "summary": projection.Summary{}})
					}
					_, err := fmt.Fprintln(g.stdout, noTargetMessage(cfg))
					return err
				}
				return runProjector(ctx, g, app, drain, batch, maxBatches, asJSON, noProgress)
			})
		}
	}
	once := &cobra.Command{
		Use:   "once",
		Short: "Run one bounded batch (--batch effects) and print a summary",
		Args:  cobra.NoArgs,
		RunE:  run(false),
	}
	drain := &cobra.Command{
		Use:   "drain",
		Short: "Run batches until nothing is claimable (or --max-batches), with progress",
		Args:  cobra.NoArgs,
		RunE:  run(true),
	}
	for _, c := range []*cobra.Command{once, drain} {
		c.Flags().IntVar(&batch, "batch", envInt("OUTBOX_PROJECTOR_BATCH", projection.BatchDefault),
			"effects claimed per batch (env OUTBOX_PROJECTOR_BATCH)")
		c.Flags().BoolVar(&asJSON, "json", false, "print the summary as JSON")
	}
	drain.Flags().IntVar(&maxBatches, "max-batches", 0, "stop after this many batches (0: until drained)")
	drain.Flags().BoolVar(&noProgress, "no-progress", false, "plain progress lines even on a terminal")
	cmd.AddCommand(once, drain)
	return cmd
}

func runProjector(ctx context.Context, g *globals, app *projection.App, drain bool, batch, maxBatches int, asJSON, noProgress bool) error {
	if batch <= 0 {
		return &ExitError{Code: ExitCouldNotRun, Err: errors.New("--batch must be positive")}
	}
	if !drain {
		maxBatches = 1
	}
	_, ready, err := app.Remaining(ctx)
	if err != nil {
		return err
	}
	total := ready
	if !drain && total > int64(batch) {
		total = int64(batch)
	}
	var bar *progressbar.ProgressBar
	if !asJSON && !noProgress && isTerminal(g.stdout) {
		bar = progressbar.NewOptions64(total,
			progressbar.OptionSetWriter(g.stdout),
			progressbar.OptionSetDescription("projecting"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("effects"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(g.stdout) }),
		)
	} else if !asJSON {
		fmt.Fprintf(g.stdout, "projecting to %s: %d effects ready\n", strings.Join(app.Targets(), ", "), ready)
	}
	// Each progress line gives that batch's own counts, then the running
	// totals; the bar follows the totals.
	progress := func(this, total projection.Summary) {
		switch {
		case bar != nil:
			if int64(total.Claimed) > bar.GetMax64() {
				bar.ChangeMax64(int64(total.Claimed))
			}
			_ = bar.Set64(int64(total.Claimed))
		case !asJSON:
			fmt.Fprintf(g.stdout, "batch %d: claimed %d, projected %d, retried %d, dead-lettered %d (so far: claimed %d, projected %d)\n",
				total.Batches, this.Claimed, this.Projected, this.Retried, this.DeadLettered, total.Claimed, total.Projected)
		}
	}
	sum, err := app.Drain(ctx, batch, maxBatches, progress)
	if bar != nil {
		_ = bar.Finish()
	}
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(g.stdout, sum)
	}
	fmt.Fprintf(g.stdout, "projected %d, retried %d, dead-lettered %d, remaining %d (%d claimable now)\n",
		sum.Projected, sum.Retried, sum.DeadLettered, sum.Remaining, sum.RemainingReady)
	if sum.LeaseLost > 0 {
		fmt.Fprintf(g.stdout, "lease lost on %d (recovered by a sweeper; nothing written)\n", sum.LeaseLost)
	}
	for _, e := range sum.LastErrors {
		fmt.Fprintf(g.stdout, "  error: %s\n", e)
	}
	return nil
}

// newReadinessProjectionCmd is `readiness projection`; it belongs in the
// `readiness` group (internal/cli/ops_readiness.go).
func newReadinessProjectionCmd(g *globals) *cobra.Command {
	var in projection.ReadinessInputs
	var records int64
	var output string
	var check, asJSON bool
	cmd := &cobra.Command{
		Use:   "projection",
		Short: "Say when to turn on the Solr and GraphDB projections, and write the launch artifact",
		Long: `projection classifies the record projection as portable, watch, enable or
enabled from the record count (read from the database unless --records is
given) and the measured workload:

  Solr:    50,000 records, search p95 >= 1000 ms, or >= 3 active discovery
           workflows over >= 10,000 records
  GraphDB: graph p95 >= 1500 ms, or >= 2 active graph workflows over
           >= 10,000 records
  watch:   from 80 % of a threshold

"enable" names the target to turn on and its prerequisites (its settings and
flag, CRON_SECRET, METAMUSEUM_OUTBOX_CRON_ENABLED=1); "enabled" means every
needed target is on and the cron drain is ready. The result is written to
--output. --check exits 3 when the scale path should be enabled but the
target or the scheduler is not ready.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			cfg, _ := projection.FromEnv(os.Getenv)
			in.SolrEnabled, in.GraphDBEnabled = cfg.Solr != nil, cfg.SPARQL != nil
			in.CronSecretSet, in.CronEnabled = cfg.CronSecret != "", cfg.CronEnabled
			if records >= 0 {
				in.Records = records
			} else {
				pool, _, err := g.open(ctx, false)
				if err != nil {
					return err
				}
				n, err := projection.CountRecords(ctx, pool)
				pool.Close()
				if err != nil {
					return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("count records (run `pgoutbox migrate`?): %w", err)}
				}
				in.Records, in.RecordsFromDatabase = n, true
			}
			if in.ActiveDiscoveryWorkflows < 0 || in.ActiveGraphWorkflows < 0 || in.SearchP95MS < 0 || in.GraphP95MS < 0 {
				return &ExitError{Code: ExitCouldNotRun, Err: errors.New("workflow counts and p95 values must not be negative")}
			}
			res := projection.Classify(in, time.Now())
			if err := writeArtifact(output, res); err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			var err error
			if asJSON {
				err = writeJSON(g.stdout, res)
			} else {
				err = printReadiness(g.stdout, res, output)
			}
			if err != nil {
				return err
			}
			if check && res.CheckFailed {
				return &ExitError{Code: ExitCheckFailed, Err: fmt.Errorf("readiness projection: %s: turn on %s (%s)",
					res.Classification, res.RecommendedTarget, strings.Join(res.Prerequisites, "; "))}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&in.ActiveDiscoveryWorkflows, "active-discovery-workflows", 0, "active discovery workflows")
	f.IntVar(&in.ActiveGraphWorkflows, "active-graph-workflows", 0, "active graph workflows")
	f.IntVar(&in.SearchP95MS, "search-p95-ms", 0, "in-app search latency p95, in ms")
	f.IntVar(&in.GraphP95MS, "graph-p95-ms", 0, "graph read latency p95, in ms")
	f.Int64Var(&records, "records", -1, "record count (default: count storage_documents.records)")
	f.StringVar(&output, "output", ReadinessOutputDefault, "where to write the JSON result")
	f.BoolVar(&check, "check", false, "exit 3 when a target should be enabled but it or the scheduler is not ready")
	f.BoolVar(&asJSON, "json", false, "print the JSON result")
	return cmd
}

// writeArtifact writes v as indented JSON to path atomically (creating its
// directory).
func writeArtifact(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(path), err)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

func printReadiness(w io.Writer, r projection.Readiness, output string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "classification:     %s\n", r.Classification)
	fmt.Fprintf(&b, "recommended target: %s\n", r.RecommendedTarget)
	src := "--records"
	if r.Inputs.RecordsFromDatabase {
		src = "database"
	}
	fmt.Fprintf(&b, "records:            %d (%s)\n", r.Inputs.Records, src)
	for _, name := range []string{projection.TargetSolr, projection.TargetGraphDB} {
		t := r.Targets[name]
		state := "off"
		if t.Enabled {
			state = "on"
		}
		fmt.Fprintf(&b, "%-19s %s (target %s)\n", name+":", t.Level, state)
	}
	for _, reason := range r.Reasons {
		fmt.Fprintf(&b, "  - %s\n", reason)
	}
	if len(r.Prerequisites) > 0 {
		b.WriteString("before enabling:\n")
		for _, p := range r.Prerequisites {
			fmt.Fprintf(&b, "  - %s\n", p)
		}
	}
	fmt.Fprintf(&b, "written to %s\n", output)
	_, err := io.WriteString(w, b.String())
	return err
}
