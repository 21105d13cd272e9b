package migrations_test

import (
	"context"
	"database/sql"
	"slices"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/pgoutbox/pgoutbox/migrations"
)

// Migration 00018 copies each per-type ordering choice (ordering_types) to
// the queues that hold ordered effects of the type not completed, and keeps
// the per-type row as the fallback of a (queue, type) without a row.
func TestOrderingChoicesMigrateExistingRows(t *testing.T) {
	t.Parallel()
	dsn := emptyDB(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE SCHEMA pgoutbox`); err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.Engine.FS, goose.WithTableName(migrations.VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 14); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		`INSERT INTO pgoutbox.ordering_types (effect_type, dead_letter_moves_on) VALUES ('mo', true), ('st', false), ('idle', true)`,
		`INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, ordering_key, state) VALUES
			('qa', 'mo', 'a1', 'k', 'dead_letter'), ('qb', 'mo', 'b1', 'k', 'available'),
			('qa', 'st', 'a2', 'k', 'available'), ('qc', 'mo', 'c1', NULL, 'available'),
			('qd', 'mo', 'd1', 'k', 'completed')`,
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if _, err := migrations.Up(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	got := query(t, dsn, `SELECT queue, effect_type, dead_letter_moves_on FROM pgoutbox.ordering_choices ORDER BY 1, 2`)
	if want := []string{"qa | mo | true", "qa | st | false", "qb | mo | true"}; !slices.Equal(got, want) {
		t.Fatalf("ordering_choices after 00018: %v, want %v", got, want)
	}
	if n := query(t, dsn, `SELECT count(*) FROM pgoutbox.ordering_types`); !slices.Equal(n, []string{"3"}) {
		t.Fatalf("ordering_types keeps %v rows, want 3 (the fallback)", n)
	}
}
