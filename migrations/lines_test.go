package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3"

	cpmigrations "github.com/pgoutbox/pgoutbox/controlplane/migrations"
	"github.com/pgoutbox/pgoutbox/migrations"
	projmigrations "github.com/pgoutbox/pgoutbox/projection/migrations"
)

// allLines are the lines `pgoutbox migrate` applies, in its order.
var allLines = []migrations.Line{migrations.Engine, cpmigrations.Line, projmigrations.Line}

// legacyUp migrates dsn's database the way the code before the split into
// lines did: one goose sequence over every migration file (versions 1..9),
// recorded in pgoutbox.goose_db_version, up to version upTo (0: all).
func legacyUp(t *testing.T, dsn string, upTo int64) {
	t.Helper()
	ctx := context.Background()
	merged := fstest.MapFS{}
	for _, l := range allLines {
		names, err := fs.Glob(l.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if v, _ := strconv.Atoi(n[:5]); v > 9 {
				continue // added after the split: never part of the single line
			}
			b, err := fs.ReadFile(l.FS, n)
			if err != nil {
				t.Fatal(err)
			}
			merged[n] = &fstest.MapFile{Data: b}
		}
	}
	if len(merged) != 9 {
		t.Fatalf("the single line had 9 migrations, the lines hold %d", len(merged))
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA pgoutbox`); err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, merged, goose.WithTableName("pgoutbox.goose_db_version"))
	if err != nil {
		t.Fatal(err)
	}
	if upTo == 0 {
		_, err = p.Up(ctx)
	} else {
		_, err = p.UpTo(ctx, upTo)
	}
	if err != nil {
		t.Fatalf("legacy up: %v", err)
	}
}

// query returns the rows of q, each as its columns joined by " | ".
func query(t *testing.T, dsn, q string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			parts[i] = fmt.Sprint(v)
		}
		out = append(out, strings.Join(parts, " | "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// userSchemas selects the schemas migrations create (and public).
const userSchemas = `nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg_toast%' AND nspname NOT LIKE 'pg_temp%'`

// schemaDump describes everything the migrations define, in a stable order:
// schemas, relations, columns, constraints, indexes, functions, triggers,
// types, comments and privileges.
func schemaDump(t *testing.T, dsn string) []string {
	t.Helper()
	var out []string
	for _, q := range []string{
		`SELECT 'schema', nspname, pg_get_userbyid(nspowner), coalesce(nspacl::text, '') FROM pg_namespace WHERE ` + userSchemas,
		`SELECT 'relation', n.nspname, c.relname, c.relkind, c.relpersistence, coalesce(c.relacl::text, ''),
			coalesce(obj_description(c.oid, 'pg_class'), '')
		 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE ` + userSchemas,
		`SELECT 'column', table_schema, table_name, ordinal_position, column_name, data_type, udt_name, is_nullable,
			coalesce(column_default, ''), is_identity, coalesce(identity_generation, ''), coalesce(generation_expression, '')
		 FROM information_schema.columns WHERE table_schema IN (SELECT nspname FROM pg_namespace WHERE ` + userSchemas + `)`,
		`SELECT 'constraint', n.nspname, conrelid::regclass::text, conname, pg_get_constraintdef(c.oid)
		 FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE ` + userSchemas,
		`SELECT 'index', schemaname, tablename, indexname, indexdef FROM pg_indexes
		 WHERE schemaname IN (SELECT nspname FROM pg_namespace WHERE ` + userSchemas + `)`,
		`SELECT 'function', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
			coalesce(p.proacl::text, ''), pg_get_userbyid(p.proowner)
		 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE p.prokind <> 'a' AND ` + userSchemas,
		`SELECT 'trigger', tgrelid::regclass::text, tgname, pg_get_triggerdef(t.oid)
		 FROM pg_trigger t WHERE NOT tgisinternal`,
		`SELECT 'type', n.nspname, t.typname, t.typtype,
			coalesce((SELECT string_agg(enumlabel, ',' ORDER BY enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), '')
		 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
		 WHERE t.typtype IN ('e', 'd', 'c') AND ` + userSchemas + ` AND NOT EXISTS (SELECT FROM pg_class c WHERE c.reltype = t.oid)`,
	} {
		out = append(out, query(t, dsn, q)...)
	}
	slices.Sort(out)
	return out
}

// versions lists each line's version table: (version, applied), in order.
func versions(t *testing.T, dsn string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, l := range allLines {
		out[l.Name] = query(t, dsn, `SELECT version_id, is_applied FROM `+l.VersionTable()+` ORDER BY id`)
	}
	return out
}

func diff(a, b []string) string {
	var sb strings.Builder
	for _, s := range a {
		if !slices.Contains(b, s) {
			fmt.Fprintf(&sb, "- %s\n", s)
		}
	}
	for _, s := range b {
		if !slices.Contains(a, s) {
			fmt.Fprintf(&sb, "+ %s\n", s)
		}
	}
	return sb.String()
}

func schemaExists(t *testing.T, dsn, name string) bool {
	t.Helper()
	return len(query(t, dsn, `SELECT 1 FROM pg_namespace WHERE nspname = '`+name+`'`)) == 1
}

func TestUpCreatesOnlyTheEngineSchema(t *testing.T) {
	t.Parallel()
	dsn := emptyDB(t)
	ctx := context.Background()
	applied, err := migrations.Up(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{1, 2, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 21, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37}; !slices.Equal(applied, want) {
		t.Fatalf("Up applied %v, want the engine's %v", applied, want)
	}
	if !schemaExists(t, dsn, "pgoutbox") {
		t.Fatal("no pgoutbox schema after Up")
	}
	for _, s := range []string{"control_plane", "storage_documents"} {
		if schemaExists(t, dsn, s) {
			t.Errorf("Up created the application schema %s", s)
		}
	}
	if fns := query(t, dsn, `SELECT proname FROM pg_proc WHERE proname LIKE 'boardreadyops%'`); len(fns) != 0 {
		t.Errorf("Up created the control plane's functions %v", fns)
	}
	// The applications' lines then apply on top of it.
	rest, err := migrations.UpLines(ctx, dsn, allLines...)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range rest {
		got = append(got, fmt.Sprintf("%s/%d", s.Line, s.Version))
	}
	if want := []string{"controlplane/4", "controlplane/9", "controlplane/20", "projection/3"}; !slices.Equal(got, want) {
		t.Fatalf("UpLines after Up applied %v, want %v", got, want)
	}
}

func TestLinesOwnDisjointVersions(t *testing.T) {
	t.Parallel()
	owner := map[int64]string{}
	for _, l := range allLines {
		names, err := fs.Glob(l.FS, "*.sql")
		if err != nil || len(names) == 0 {
			t.Fatalf("%s line: %v %v", l.Name, names, err)
		}
		for _, n := range names {
			v, err := goose.NumericComponent(n)
			if err != nil {
				t.Fatal(err)
			}
			if o, dup := owner[v]; dup {
				t.Errorf("version %d in the %s and %s lines", v, o, l.Name)
			}
			owner[v] = l.Name
			schema, legacy := migrations.LegacyOwners[v]
			switch {
			case l.Name == migrations.Engine.Name && legacy:
				t.Errorf("the engine's %s uses version %d, reserved for a record of the single line owned by %s", n, v, schema)
			case l.Name != migrations.Engine.Name && v <= 9 && (!legacy || schema != l.Schema):
				t.Errorf("%s (single-line version %d) is in the %s line, whose records the upgrade moves to %q", n, v, l.Name, schema)
			}
		}
	}
}

// postSplit lists, per line, the versions added after the split into lines
// (above 9): an upgraded single-line database still has them to apply.
func postSplit(t *testing.T, lines ...migrations.Line) map[string][]int64 {
	t.Helper()
	out := map[string][]int64{}
	for _, l := range lines {
		names, err := fs.Glob(l.FS, "*.sql")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if v, _ := strconv.Atoi(n[:5]); v > 9 {
				out[l.Name] = append(out[l.Name], int64(v))
			}
		}
	}
	return out
}

// appliedByLine groups what UpLines applied by line.
func appliedByLine(st []migrations.Status) map[string][]int64 {
	out := map[string][]int64{}
	for _, m := range st {
		out[m.Line] = append(out[m.Line], m.Version)
	}
	return out
}

func TestSingleLineDatabaseUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fresh := emptyDB(t)
	if _, err := migrations.UpLines(ctx, fresh, allLines...); err != nil {
		t.Fatal(err)
	}
	old := emptyDB(t)
	legacyUp(t, old, 0)
	// Data survives the upgrade.
	if _, err := pgxExec(t, old, `INSERT INTO control_plane.installations (id, state) VALUES (1, 'active')`); err != nil {
		t.Fatal(err)
	}
	// Read-only check first: nothing pending but what came after the
	// split, nothing written.
	for _, lines := range [][]migrations.Line{{migrations.Engine}, allLines} {
		pending, err := migrations.PendingLines(ctx, old, lines...)
		if want := len(postSplit(t, lines...)) > 0; err != nil || pending != want {
			t.Fatalf("PendingLines on the single line's database: %v %v, want %v", pending, err, want)
		}
	}
	if s := query(t, old, `SELECT to_regclass('control_plane.goose_db_version')`); s[0] != "<nil>" {
		t.Fatalf("PendingLines wrote %s", s[0])
	}
	applied, err := migrations.UpLines(ctx, old, allLines...)
	if want := postSplit(t, allLines...); err != nil || fmt.Sprint(appliedByLine(applied)) != fmt.Sprint(want) {
		t.Fatalf("upgrade applied %v (%v), want only what came after the split %v", applied, err, want)
	}
	freshDump := schemaDump(t, fresh)
	if d := diff(freshDump, schemaDump(t, old)); d != "" {
		t.Fatalf("the upgraded database differs from a fresh one (- fresh, + upgraded):\n%s", d)
	}
	// The dump sees what it compares: every line's objects and version table.
	for _, want := range []string{"relation | pgoutbox | effects |", "relation | control_plane | goose_db_version |",
		"relation | storage_documents | records |", "function | public | boardreadyops_replay_control_plane_outbox |",
		"trigger | pgoutbox.effects |", "type | pgoutbox | effect_state |"} {
		if !slices.ContainsFunc(freshDump, func(s string) bool { return strings.HasPrefix(s, want) }) {
			t.Errorf("the schema dump has no %q", want)
		}
	}
	wantVersions := versions(t, fresh)
	if got := versions(t, old); fmt.Sprint(got) != fmt.Sprint(wantVersions) {
		t.Fatalf("version tables after the upgrade: %v, want %v", got, wantVersions)
	}
	if n := query(t, old, `SELECT count(*) FROM control_plane.installations`); n[0] != "1" {
		t.Fatalf("installations after the upgrade: %s, want 1", n[0])
	}
	list, err := migrations.ListLines(ctx, old, allLines...)
	extra := 0
	for _, v := range postSplit(t, allLines...) {
		extra += len(v)
	}
	if err != nil || len(list) != 9+extra {
		t.Fatalf("ListLines: %d migrations, %v", len(list), err)
	}
	for _, m := range list {
		if !m.Applied || m.AppliedAt == "" {
			t.Fatalf("%s/%d not applied after the upgrade", m.Line, m.Version)
		}
	}
}

func TestPartialSingleLineDatabaseUpgrades(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := emptyDB(t)
	legacyUp(t, old, 4) // the single line stopped after the control plane's first
	pending, err := migrations.PendingLines(ctx, old, projmigrations.Line)
	if err != nil || pending {
		t.Fatalf("projection line pending: %v %v, want false (version 3 applied)", pending, err)
	}
	pending, err = migrations.PendingLines(ctx, old, cpmigrations.Line)
	if err != nil || !pending {
		t.Fatalf("control plane line pending: %v %v, want true (version 9 missing)", pending, err)
	}
	// The engine's line alone (a library user's Up) keeps the applications'
	// records for their lines.
	applied, err := migrations.Up(ctx, old)
	wantUp := append([]int64{5, 6, 7, 8}, postSplit(t, migrations.Engine)[migrations.Engine.Name]...)
	if err != nil || !slices.Equal(applied, wantUp) {
		t.Fatalf("Up applied %v (%v), want %v", applied, err, wantUp)
	}
	rest, err := migrations.UpLines(ctx, old, allLines...)
	wantRest := postSplit(t, cpmigrations.Line, projmigrations.Line)
	wantRest["controlplane"] = append([]int64{9}, wantRest["controlplane"]...)
	if err != nil || fmt.Sprint(appliedByLine(rest)) != fmt.Sprint(wantRest) {
		t.Fatalf("UpLines applied %v (%v), want %v", rest, err, wantRest)
	}
	fresh := emptyDB(t)
	if _, err := migrations.UpLines(ctx, fresh, allLines...); err != nil {
		t.Fatal(err)
	}
	if d := diff(schemaDump(t, fresh), schemaDump(t, old)); d != "" {
		t.Fatalf("the upgraded database differs from a fresh one (- fresh, + upgraded):\n%s", d)
	}
}

func TestConcurrentUpgradeMovesRecordsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := emptyDB(t)
	legacyUp(t, old, 0)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	applied := make([][]migrations.Status, 4)
	for i := range 4 {
		wg.Go(func() { applied[i], errs[i] = migrations.UpLines(ctx, old, allLines...) })
	}
	wg.Wait()
	var all []migrations.Status
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: applied %v, %v", i, applied[i], errs[i])
		}
		all = append(all, applied[i]...)
	}
	// Between them the migrators applied each post-split migration once
	// and nothing else.
	if got, want := appliedByLine(all), postSplit(t, allLines...); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the migrators applied %v, want %v once", got, want)
	}
	got := versions(t, old)
	want := map[string][]string{
		"engine":       {"0 | true", "1 | true", "2 | true", "5 | true", "6 | true", "7 | true", "8 | true"},
		"controlplane": {"0 | true", "4 | true", "9 | true"},
		"projection":   {"0 | true", "3 | true"},
	}
	for line, vs := range postSplit(t, allLines...) {
		for _, v := range vs {
			want[line] = append(want[line], fmt.Sprintf("%d | true", v))
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("version tables: %v, want %v", got, want)
	}
}

func pgxExec(t *testing.T, dsn, q string) (int64, error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, q)
	return tag.RowsAffected(), err
}
