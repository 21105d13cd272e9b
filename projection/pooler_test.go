package projection_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/adapters/solr"
	fake "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/projection"
)

// The projection through a PgBouncer 1.18 in transaction mode
// (docs/poolers.md): the records API, the import, and the projector's
// deliveries (under their transaction-scoped advisory locks) all run
// through the pooler, in pgx's exec query mode.
func TestProjectionThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pooled, _ := pgtest.NewPooledDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := fake.New(fake.Options{Username: "solr", Password: "SolrRocks"})
	t.Cleanup(s.Close)
	b := setupOn(t, pool, projection.Config{Concurrency: 4,
		Solr: &solr.Config{BaseURL: s.URL(), Core: solrCore, Username: "solr", Password: "SolrRocks", Timeout: 10 * time.Second}})
	const n = 200
	b.importN(t, n, "Record")
	c := b.startClient(t)
	b.waitState(t, c, "completed", n)
	if got := s.Count(solrCore); got != n {
		t.Fatalf("Solr holds %d documents, want %d", got, n)
	}
	// A changed record is projected again.
	code, out, _ := b.do(t, http.MethodPost, "/api/import", "application/x-ndjson",
		strings.NewReader(`{"id":"r7","title":"changed"}`+"\n"))
	if code != 200 {
		t.Fatalf("re-import: %d %s", code, out)
	}
	b.waitState(t, c, "completed", n+1)
	if d := s.Doc(solrCore, "r7"); d["title"] != "changed" {
		t.Fatalf("r7 after the change: %v", d)
	}
}
