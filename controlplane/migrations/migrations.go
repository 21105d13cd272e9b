// Package migrations holds the release control plane's migration line: the
// schema control_plane, recorded in control_plane.goose_db_version. It needs
// the engine's line (package github.com/pgoutbox/pgoutbox/migrations)
// applied first; `pgoutbox migrate` applies both.
package migrations

import (
	"embed"

	engine "github.com/pgoutbox/pgoutbox/migrations"
)

//go:embed [0-9]*.sql
var files embed.FS

// Line is the control plane's migration line; apply it with
// engine.UpLines(ctx, dsn, engine.Engine, Line).
var Line = engine.Line{Name: "controlplane", Schema: "control_plane", FS: files}
