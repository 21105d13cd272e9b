// Package migrations holds the record projection's migration line: the
// schema storage_documents, recorded in storage_documents.goose_db_version.
// It needs the engine's line (package
// github.com/pgoutbox/pgoutbox/migrations) applied first; `pgoutbox migrate`
// applies both.
package migrations

import (
	"embed"

	engine "github.com/pgoutbox/pgoutbox/migrations"
)

//go:embed [0-9]*.sql
var files embed.FS

// Line is the record projection's migration line; apply it with
// engine.UpLines(ctx, dsn, engine.Engine, Line).
var Line = engine.Line{Name: "projection", Schema: "storage_documents", FS: files}
