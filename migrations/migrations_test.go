package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, func() error { return goleak.Find() })
}

// emptyDB creates an unmigrated database and returns its DSN.
func emptyDB(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	admin := pgtest.AdminDSN(t)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("pgoutbox_mig_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(context.Background())
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func TestUpTwiceIsNoOp(t *testing.T) {
	t.Parallel()
	dsn := emptyDB(t)
	ctx := context.Background()
	first, err := migrations.Up(ctx, dsn)
	if err != nil || len(first) == 0 {
		t.Fatalf("first up: %v %v", first, err)
	}
	second, err := migrations.Up(ctx, dsn)
	if err != nil || len(second) != 0 {
		t.Fatalf("second up applied %v (%v), want nothing", second, err)
	}
	list, err := migrations.List(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if !m.Applied {
			t.Fatalf("%d pending after up", m.Version)
		}
	}
}

func TestConcurrentUpIsSafe(t *testing.T) {
	t.Parallel()
	dsn := emptyDB(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	applied := make([][]int64, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() { applied[i], errs[i] = migrations.Up(ctx, dsn) })
	}
	wg.Wait()
	total := 0
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("migrator %d: %v", i, errs[i])
		}
		total += len(applied[i])
	}
	list, err := migrations.List(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if total != len(list) {
		t.Fatalf("%d applications for %d migrations: each must be applied exactly once", total, len(list))
	}
}
