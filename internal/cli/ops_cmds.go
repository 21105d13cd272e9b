package cli

// The operator commands (docs/operations.md; internal/ops): status,
// dlq list/replay, requeue-stale, alert check and readiness broker. Each has
// human output (aligned tables, ages like "3m12s") and --json; filters are
// passed to SQL as bind parameters.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// filterFlags are --queue and --effect-type.
type filterFlags struct{ f ops.Filter }

func (ff *filterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&ff.f.Queue, "queue", "", "only this queue (compared literally)")
	cmd.Flags().StringVar(&ff.f.Type, "effect-type", "", "only this effect type (compared literally)")
}

// stalledAfterFlag registers --stalled-after, defaulting to
// OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES.
func stalledAfterFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "stalled-after", envMinutes("OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES", ops.StalledAfterDefault),
		"a lease held longer than this is stalled (env OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES, in minutes)")
}

// envMinutes reads a whole number of minutes from name, or def.
func envMinutes(name string, def time.Duration) time.Duration {
	return time.Duration(envInt(name, int(def/time.Minute))) * time.Minute
}

// openOps opens a pool on the database for an operator command. It never
// migrates: a missing schema is reported with the command that fixes it.
func openOps(cmd *cobra.Command, g *globals) (*pgxpool.Pool, error) {
	pool, _, err := g.open(cmd.Context(), false)
	return pool, err
}

// opsErr maps an ops error to an exit error (1: could not run).
func opsErr(err error) error {
	var ee *ExitError
	if errors.As(err, &ee) {
		return err
	}
	if store.IsUndefinedTable(err) {
		err = fmt.Errorf("%w (is the database migrated? run: pgoutbox migrate)", err)
	}
	return &ExitError{Code: ExitCouldNotRun, Err: err}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0) }

// row writes one tab-separated table row.
func row(tw io.Writer, cells ...any) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(tw, "\t")
		}
		fmt.Fprint(tw, c)
	}
	fmt.Fprintln(tw)
}

// age formats seconds like "3m12s" (whole seconds), "42ms" under a second
// and "0s" for zero.
func age(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// lag formats an optional lag like age, with centiseconds under a minute
// ("1.25s"); "-" when absent.
func lag(seconds *float64) string {
	if seconds == nil {
		return "-"
	}
	if d := time.Duration(*seconds * float64(time.Second)); d >= time.Second && d < time.Minute {
		return d.Round(10 * time.Millisecond).String()
	}
	return age(*seconds)
}

// cell makes text safe for one table cell: runs of spaces and control
// characters (newlines, tabs, terminal escapes) become one space, and it is
// cut to max runes.
func cell(s string, max int) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsControl(r) || unicode.IsSpace(r)
	}), " ")
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

// report runs an operator query and prints its result: JSON with --json
// (asJSON), else through print.
func report[T any](cmd *cobra.Command, g *globals, asJSON bool, query func(context.Context, *pgxpool.Pool) (T, error), print func(T) error) error {
	return withPool(cmd, g, func(ctx context.Context, pool *pgxpool.Pool) error {
		res, err := query(ctx, pool)
		if err != nil {
			return err
		}
		if asJSON {
			return writeJSON(g.stdout, res)
		}
		return print(res)
	})
}

// withPool runs fn with a pool for an operator command.
func withPool(cmd *cobra.Command, g *globals, fn func(ctx context.Context, pool *pgxpool.Pool) error) error {
	pool, err := openOps(cmd, g)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := fn(cmd.Context(), pool); err != nil {
		return opsErr(err)
	}
	return nil
}
