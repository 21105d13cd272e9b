// Command pgoutbox is the pgoutbox binary: the HTTP server, the workers and
// the operator commands. Run `pgoutbox --help`.
package main

import (
	"context"
	"os"

	"github.com/pgoutbox/pgoutbox/internal/cli"
)

func main() {
	os.Exit(cli.Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
