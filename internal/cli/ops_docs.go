package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// newDocsCmd is the hidden `docs` command: the command reference in
// Markdown, generated from the command tree (docs/cli.md; a test checks it
// is current). Flag defaults read from the environment, so generate it with
// a clean environment: env -i PATH="$PATH" pgoutbox docs > docs/cli.md.
func newDocsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:    "docs",
		Short:  "Print the command reference in Markdown",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeDocs(g.stdout, cmd.Root())
		},
	}
}

func writeDocs(w io.Writer, root *cobra.Command) error {
	var b strings.Builder
	b.WriteString("# pgoutbox command reference\n\n")
	b.WriteString("<!-- Generated from the command tree by `pgoutbox docs`; do not edit. Regenerate with\n")
	b.WriteString("     go test ./internal/cli -run TestCLIDocs -update-docs -->\n\n")
	b.WriteString("Exit codes: 0 ok, 1 could not run, 3 a check found a problem.\n\n")
	fmt.Fprintf(&b, "Global flags (every command):\n\n```\n%s```\n", root.PersistentFlags().FlagUsages())
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "completion" {
				continue
			}
			fmt.Fprintf(&b, "\n## %s\n\n%s\n", sub.CommandPath(), sub.Short)
			if sub.Long != "" {
				fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(sub.Long))
			}
			if sub.Runnable() {
				fmt.Fprintf(&b, "\n```\n%s\n", sub.UseLine())
				if fl := sub.NonInheritedFlags().FlagUsages(); fl != "" {
					fmt.Fprintf(&b, "\n%s", fl)
				}
				b.WriteString("```\n")
			}
			walk(sub)
		}
	}
	walk(root)
	_, err := io.WriteString(w, b.String())
	return err
}
