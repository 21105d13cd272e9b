// Package cli is the pgoutbox binary's cobra commands. Configuration comes
// from environment variables (names in docs/operations.md) and flags override them;
// every flag's help names its variable and default.
//
// Exit codes: 0 ok, 1 could not run, 3 a check found a problem.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes shared by every command.
const (
	ExitOK          = 0
	ExitCouldNotRun = 1
	ExitCheckFailed = 3
)

// ExitError carries a command's exit code.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Version is set at build time with -ldflags "-X github.com/pgoutbox/pgoutbox/internal/cli.Version=…".
var Version = "dev"

// globals are the flags every command shares.
type globals struct {
	databaseURL string
	sessionURL  string // PGOUTBOX_SESSION_DATABASE_URL: LISTEN and migrations behind a pooler
	pooled      bool   // set by open: DATABASE_URL goes through a transaction pooler
	logLevel    string
	logFormat   string
	dataDir     string
	stdout      io.Writer
	stderr      io.Writer
}

func (g *globals) logger() *slog.Logger { return g.loggerTo(g.stderr) }

// loggerTo is logger writing to w.
func (g *globals) loggerTo(w io.Writer) *slog.Logger {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		lvl = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: lvl}
	if g.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// NewRoot returns the pgoutbox command tree writing to stdout and stderr.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "pgoutbox",
		Short: "A transactional outbox for PostgreSQL",
		Long: `pgoutbox delivers effects written in the same PostgreSQL transaction as the state
change that caused them: claimed under fenced leases, retried with backoff,
dead-lettered and replayable, and moved to reconciliation_required when the
outcome of a non-idempotent effect is unknown.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", os.Getenv("DATABASE_URL"),
		"PostgreSQL connection string (env DATABASE_URL; unset: the embedded PostgreSQL under --data-dir)")
	pf.StringVar(&g.sessionURL, "session-database-url", os.Getenv("PGOUTBOX_SESSION_DATABASE_URL"),
		"when DATABASE_URL goes through a transaction-pooling proxy: the database's direct (session) address, "+
			"for LISTEN and migrations (env PGOUTBOX_SESSION_DATABASE_URL; docs/poolers.md)")
	pf.StringVar(&g.dataDir, "data-dir", envOr("PGOUTBOX_DATA_DIR", ".pgoutbox"),
		"where the embedded PostgreSQL lives when DATABASE_URL is unset (env PGOUTBOX_DATA_DIR)")
	pf.StringVar(&g.logLevel, "log-level", envOr("PGOUTBOX_LOG_LEVEL", "info"),
		"debug, info, warn or error (env PGOUTBOX_LOG_LEVEL)")
	pf.StringVar(&g.logFormat, "log-format", envOr("PGOUTBOX_LOG_FORMAT", "text"),
		"text or json (env PGOUTBOX_LOG_FORMAT)")
	// A misspelt level or format is refused before any command runs, rather
	// than quietly logging at info as text.
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return g.checkLogFlags() }
	root.AddCommand(commands(g)...)
	return root
}

// checkLogFlags refuses a --log-level or --log-format (or their variables)
// that logger would not honour.
func (g *globals) checkLogFlags() error {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(g.logLevel)); err != nil {
		return &ExitError{Code: ExitCouldNotRun,
			Err: fmt.Errorf("--log-level (PGOUTBOX_LOG_LEVEL) %q: want debug, info, warn or error", g.logLevel)}
	}
	if g.logFormat != "text" && g.logFormat != "json" {
		return &ExitError{Code: ExitCouldNotRun,
			Err: fmt.Errorf("--log-format (PGOUTBOX_LOG_FORMAT) %q: want text or json", g.logFormat)}
	}
	return nil
}

// Execute runs the command tree and returns the process exit code.
func Execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, "pgoutbox:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, "pgoutbox:", err)
	return ExitCouldNotRun
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(g.stdout, "pgoutbox %s\n", Version)
			return err
		},
	}
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// envDuration reads a Go duration ("90s", "24h") from name, or def.
func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// envInt reads an integer from name, or def.
func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}
