package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/demo"
	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f any) bool {
	file, ok := f.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newDemoCmd(g *globals) *cobra.Command {
	var (
		addr         string
		exitWhenDone bool
		asJSON       bool
		reset        bool
		sparqlURL    string
		records      int
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system with GitHub and Solr emulators and tell its story",
		Long: `demo starts PostgreSQL (embedded under --data-dir unless DATABASE_URL is set), migrates,
serves HTTP, starts the GitHub and Solr emulators in-process, and drives both applications through
their real endpoints: signed webhooks to release runs, Check Runs and dispatches (one of which lands
in reconciliation_required), and an import of records projected to Solr through a burst of 5xx,
with one poisoned record that dead-letters. It then prints a summary and keeps serving until
Ctrl-C (or exits with --exit-when-done).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			out := g.stdout
			if asJSON {
				out = g.stderr // the story and status go to stderr; stdout carries the JSON
			}
			if g.databaseURL == "" {
				if reset {
					if err := embedded.ResetLocal(g.dataDir); err != nil {
						return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--reset: %w", err)}
					}
					fmt.Fprintf(out, "reset: removed the embedded PostgreSQL at %s\n", g.dataDir)
				} else if embedded.LocalInitialized(g.dataDir) {
					fmt.Fprintf(out, "reusing the embedded PostgreSQL at %s (earlier runs' data is kept; --reset starts clean)\n", g.dataDir)
				} else {
					fmt.Fprintf(out, "creating an embedded PostgreSQL at %s (first run: about a minute)\n", g.dataDir)
				}
			}
			pool, _, err := g.open(ctx, true)
			if err != nil {
				return err
			}
			defer pool.Close()
			// The components' logs go to a file: the screen tells the story.
			logDir := g.dataDir
			if g.databaseURL != "" {
				logDir = os.TempDir()
			}
			logPath := filepath.Join(logDir, "demo.log")
			logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			defer logFile.Close()
			fmt.Fprintf(out, "component logs: %s\n", logPath)
			d, err := demo.Start(ctx, demo.Options{
				Pool: pool, Addr: addr, Out: out, Log: g.loggerTo(logFile), Live: !asJSON && isTerminal(g.stdout),
				Records: records, SPARQLURL: sparqlURL, OperatorToken: os.Getenv("PGOUTBOX_OPERATOR_TOKEN"),
				Command: invokedAs(), ExitWhenDone: exitWhenDone, KeyDir: logDir,
			})
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			closeDemo := func() {
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
				defer cancel()
				_ = d.Close(cctx)
			}
			summary, storyErr := d.Story(ctx)
			if asJSON {
				_ = summary.Print(g.stdout, true)
			} else {
				_ = summary.Print(out, false)
			}
			if storyErr != nil || summary.Lost != 0 {
				closeDemo()
				if storyErr == nil {
					storyErr = fmt.Errorf("%d effects lost", summary.Lost)
				}
				return &ExitError{Code: ExitCheckFailed, Err: storyErr}
			}
			if !exitWhenDone {
				if os.Getenv("PGOUTBOX_OPERATOR_TOKEN") != "" {
					fmt.Fprintf(out, "\nHandle the incidents in the operator console: %s/console/ (sign in with PGOUTBOX_OPERATOR_TOKEN)\n", d.URL())
				} else {
					fmt.Fprintf(out, "\nOperator console (read-only; set PGOUTBOX_OPERATOR_TOKEN to act there): %s/console/\n", d.URL())
				}
				fmt.Fprintf(out, "\nStill serving on %s — Ctrl-C to stop.\n", d.URL())
				if err := d.Serve(ctx); err != nil {
					closeDemo()
					return &ExitError{Code: ExitCouldNotRun, Err: err}
				}
			}
			closeDemo()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", demo.AddrDefault, "HTTP listen address (default: a free port)")
	f.BoolVar(&exitWhenDone, "exit-when-done", false, "exit 0 after the story and its summary instead of serving")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON on stdout (the story goes to stderr)")
	f.BoolVar(&reset, "reset", false, "delete the embedded PostgreSQL first and start clean")
	f.StringVar(&sparqlURL, "sparql-url", "", "also project records to this SPARQL 1.1 update endpoint")
	f.IntVar(&records, "records", demo.RecordsDefault, "records in the generated import")
	return cmd
}

// newEmbeddedCmd manages the embedded PostgreSQL that serve and demo start
// when DATABASE_URL is unset (it keeps running between runs, for reuse).
func newEmbeddedCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "embedded",
		Short: "Stop or delete the embedded PostgreSQL under --data-dir",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "stop",
		Short: "Stop the embedded PostgreSQL (the next serve or demo starts it again)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := embedded.StopLocal(g.dataDir); err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			fmt.Fprintf(g.stdout, "stopped the embedded PostgreSQL at %s\n", g.dataDir)
			return nil
		},
	}, &cobra.Command{
		Use:   "reset",
		Short: "Stop the embedded PostgreSQL and delete its data",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := embedded.ResetLocal(g.dataDir); err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			fmt.Fprintf(g.stdout, "deleted the embedded PostgreSQL at %s\n", g.dataDir)
			return nil
		},
	})
	return cmd
}

// invokedAs is how the demo's hints run this binary again from the current
// directory: as typed when it was started by a path (./bin/pgoutbox, which
// make demo uses and which is not on PATH), else by its name.
func invokedAs() string {
	if a := os.Args[0]; filepath.Base(a) == "pgoutbox" && strings.ContainsRune(a, filepath.Separator) {
		return a
	}
	return "pgoutbox"
}
