package cli

import "github.com/spf13/cobra"

// This file lists, in one place, every command of the binary and every
// application `serve` and `work` run. No other file registers anything.

// commands are the root's subcommands, in the order they are added (help
// lists them alphabetically).
func commands(g *globals) []*cobra.Command {
	return []*cobra.Command{
		// The core: version, schema, the server.
		newVersionCmd(g),
		newMigrateCmd(g),
		newServeCmd(g),
		// Measuring and showing.
		newBenchCmd(g),
		newDemoCmd(g),
		newEmbeddedCmd(g),
		// Operations (docs/operations.md).
		newStatusCmd(g),
		newDLQCmd(g),
		newRequeueStaleCmd(g),
		newBlockedKeysCmd(g),
		newQueueCmd(g),
		newAlertCmd(g),
		newReadinessCmd(g),
		newDocsCmd(g),
		newCompactCmd(g),
		newEffectCmd(g),
		// The applications' own commands, and the workers.
		newProjectorCmd(g),
		newReconcileCmd(g),
		newWorkCmd(g),
	}
}

// applications lists every application `serve` and `work` run, in start
// order: the release control plane, the record projection, then HTTP
// delivery (PGOUTBOX_HTTP_DELIVERY). Their queues and effect types are
// merged in this order, and their components start in it.
func applications() []appConstructor {
	return []appConstructor{
		controlPlaneApp,
		projectionApp,
		httpDeliveryApp,
	}
}
