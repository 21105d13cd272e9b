package main

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The held-xmin scenario's dead-tuple figures read every table of
// Tables(): n_dead_tup every interval, pgstattuple at every phase's end. A
// table that does not exist makes the sample -1 (plotted as missing) and
// the pgstattuple count an error, so both storages' lists must name tables
// the migrations create, and batch storage's must name every partition of
// the stream, where its effects are.
func TestXminSamplesEveryTableOfBothStorages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.NewDB(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple"); err != nil {
		t.Skipf("no pgstattuple on this server: %v", err)
	}
	var partitions []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(inhrelid::regclass::text ORDER BY 1), '{}') FROM pg_inherits
		WHERE inhparent = 'pgoutbox.stream'::regclass`).Scan(&partitions); err != nil {
		t.Fatal(err)
	}
	if len(partitions) == 0 {
		t.Fatal("pgoutbox.stream has no partitions")
	}
	for _, s := range []*pgSystem{
		{name: "pgoutbox"},
		{name: "pgoutbox[storage=batch]", knobs: pgKnobs{storage: pgoutbox.StorageBatch}},
	} {
		tables := s.Tables()
		if n := deadTupSampled(ctx, pool, tables); n < 0 {
			t.Errorf("%s: n_dead_tup of %v not read", s.name, tables)
		}
		d := pgstattuple(ctx, pool, tables, phaseHeld)
		if d.Error != "" || len(d.Tables) != len(tables) {
			t.Errorf("%s: pgstattuple of %v = %+v", s.name, tables, d)
		}
		if !s.batch() {
			continue
		}
		for _, p := range partitions {
			if !slices.Contains(tables, p) {
				t.Errorf("%s: stream partition %s not among the sampled tables %v", s.name, p, tables)
			}
		}
	}
}
