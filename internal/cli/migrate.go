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
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := g.dsn(cmd.Context())
			if err != nil {
				return err
			}
			applied, err := migrations.Up(cmd.Context(), dsn)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			if len(applied) == 0 {
				fmt.Fprintln(g.stdout, "database is up to date; nothing applied")
				return nil
			}
			for _, v := range applied {
				fmt.Fprintf(g.stdout, "applied %05d\n", v)
			}
			return nil
		},
	}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "List migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dsn, err := g.dsn(cmd.Context())
			if err != nil {
				return err
			}
			list, err := migrations.List(cmd.Context(), dsn)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tSOURCE\tSTATE\tAPPLIED AT")
			for _, m := range list {
				state := "pending"
				if m.Applied {
					state = "applied"
				}
				fmt.Fprintf(tw, "%05d\t%s\t%s\t%s\n", m.Version, m.Source, state, m.AppliedAt)
			}
			return tw.Flush()
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(status)
	return cmd
}
