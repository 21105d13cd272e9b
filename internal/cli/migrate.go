package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending migrations (idempotent; safe to run from several processes at once)",
		Long: `migrate applies pending migrations (idempotent; safe to run from several processes at
once: they hold a session advisory lock): the engine's line, then the
control plane's and the projection's, each recorded in its own version table
(<schema>.goose_db_version). A database migrated before the split into lines
is adopted on the first run. When DATABASE_URL goes through a
transaction-pooling proxy, migrations run on PGOUTBOX_SESSION_DATABASE_URL,
and without it migrate refuses when one is pending (docs/poolers.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var applied []migrations.Status
			if g.sessionURL != "" {
				if err := g.migrate(cmd.Context(), "", &applied); err != nil {
					return err
				}
			} else {
				// open migrates on DATABASE_URL, or refuses when it goes
				// through a transaction pooler and a migration is pending.
				pool, dsn, err := g.open(cmd.Context(), false)
				if err != nil {
					return err
				}
				pool.Close()
				if err := g.migrate(cmd.Context(), dsn, &applied); err != nil {
					return err
				}
			}
			if len(applied) == 0 {
				fmt.Fprintln(g.stdout, "database is up to date; nothing applied")
				return nil
			}
			for _, m := range applied {
				fmt.Fprintf(g.stdout, "applied %05d (%s line: %s)\n", m.Version, m.Line, m.Source)
			}
			return nil
		},
	}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations, line by line, and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := g.dsn(cmd.Context())
			if err != nil {
				return err
			}
			list, err := migrations.ListLines(cmd.Context(), dsn, migrationLines...)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LINE\tVERSION\tSOURCE\tSTATE\tAPPLIED AT")
			for _, m := range list {
				state := "pending"
				if m.Applied {
					state = "applied"
				}
				fmt.Fprintf(tw, "%s\t%05d\t%s\t%s\t%s\n", m.Line, m.Version, m.Source, state, m.AppliedAt)
			}
			return tw.Flush()
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(status)
	return cmd
}
