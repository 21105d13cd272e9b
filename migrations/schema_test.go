package migrations_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite each line's schema.sql from a migrated database")

// schemaFiles are the files that hold each line's current schema, beside
// its migrations.
var schemaFiles = map[string]string{
	"pgoutbox":          "schema.sql",
	"control_plane":     filepath.Join("..", "controlplane", "migrations", "schema.sql"),
	"storage_documents": filepath.Join("..", "projection", "migrations", "schema.sql"),
}

// TestSchemaFilesAreCurrent: each line's schema.sql is its schema as pg_dump
// prints it from a database every migration has run on (tables, indexes,
// functions, triggers, grants; not the goose version table). A migration that
// changes a schema without the file following fails here; -update-schema
// rewrites the files.
func TestSchemaFilesAreCurrent(t *testing.T) {
	dsn := pgtest.NewDB(t) // every line applied, from the template
	pgDump := pgDumpFor(t, dsn)
	for _, l := range allLines {
		path, ok := schemaFiles[l.Schema]
		if !ok {
			t.Errorf("line %s (schema %s) has no schema.sql in schemaFiles", l.Name, l.Schema)
			continue
		}
		got := dumpSchema(t, pgDump, dsn, l.Schema)
		if *updateSchema {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (generate it: go test ./migrations -run TestSchemaFilesAreCurrent -update-schema)", err)
		}
		if !bytes.Equal(want, got) {
			t.Errorf("%s is not the schema %s that the migrations make (first difference at line %d); regenerate it:\n"+
				"  go test ./migrations -run TestSchemaFilesAreCurrent -update-schema", path, l.Schema, firstDiff(want, got))
		}
	}
}

// dumpSchema is pg_dump's schema-only output for schema, without what
// varies by machine or pg_dump run: comments, SET lines, owners, the
// \restrict lines of newer clients, the goose version table.
func dumpSchema(t *testing.T, pgDump, dsn, schema string) []byte {
	t.Helper()
	cmd := exec.Command(pgDump, "--schema-only", "--no-owner", "--schema="+schema,
		"--exclude-table="+schema+".goose_db_version", "--exclude-table="+schema+".goose_db_version_id_seq", "--dbname="+dsn)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pg_dump %s: %v: %s", schema, err, stderr.String())
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "-- The current schema %s, as the migrations leave it (pg_dump --schema-only --no-owner).\n", schema)
	b.WriteString("-- Generated: go test ./migrations -run TestSchemaFilesAreCurrent -update-schema. Do not edit;\n")
	b.WriteString("-- change the schema with a new migration.\n")
	blank := true
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "--"), strings.HasPrefix(line, "SET "), strings.HasPrefix(line, `\`),
			strings.HasPrefix(line, "SELECT pg_catalog.set_config("):
			continue
		case strings.TrimSpace(line) == "":
			if !blank {
				b.WriteString("\n")
			}
			blank = true
			continue
		}
		blank = false
		b.WriteString(line + "\n")
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

// pgDumpFor finds the pg_dump of the server's major version: beside the
// server binaries (Debian's /usr/lib/postgresql/N/bin), else on PATH.
func pgDumpFor(t *testing.T, dsn string) string {
	t.Helper()
	major, err := strconv.Atoi(query(t, dsn, `SELECT current_setting('server_version_num')::int / 10000`)[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fmt.Sprintf("/usr/lib/postgresql/%d/bin/pg_dump", major), fmt.Sprintf("/usr/pgsql-%d/bin/pg_dump", major)} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("pg_dump")
	if err != nil {
		t.Fatalf("no pg_dump for PostgreSQL %d (install the PostgreSQL client: ./scripts/test-deps)", major)
	}
	return p
}

// firstDiff is the 1-based line where a and b first differ.
func firstDiff(a, b []byte) int {
	al, bl := bytes.Split(a, []byte("\n")), bytes.Split(b, []byte("\n"))
	for i := range min(len(al), len(bl)) {
		if !bytes.Equal(al[i], bl[i]) {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
