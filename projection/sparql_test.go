package projection_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
	"github.com/pgoutbox/pgoutbox/adapters/sparql/sparqltest"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/projection"
)

// graphStore is a real Virtuoso behind a proxy that can fail requests.
type graphStore struct {
	v      *sparqltest.Server
	prefix string
	fail   atomic.Int32 // status to answer instead of forwarding (0: forward)
	calls  atomic.Int64
}

// setupSPARQL is setup with the SPARQL target on Virtuoso, through a proxy
// that can inject failures; graphs of this test share a unique prefix.
func setupSPARQL(t *testing.T, cfg projection.Config) (*bundle, *graphStore) {
	t.Helper()
	g := &graphStore{v: sparqltest.Start(t), prefix: fmt.Sprintf("urn:t:%d:", time.Now().UnixNano())}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.calls.Add(1)
		if st := g.fail.Load(); st != 0 {
			http.Error(w, "injected", int(st))
			return
		}
		body, _ := io.ReadAll(r.Body) // Virtuoso refuses chunked request bodies
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, g.v.SPARQLURL, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(proxy.Close)
	cfg.SPARQL = &sparql.Config{UpdateURL: proxy.URL + "/sparql", GraphPrefix: g.prefix}
	return setup(t, cfg), g
}

func (g *graphStore) graphs(t *testing.T, b *bundle) int {
	t.Helper()
	n, err := g.v.Count(b.ctx, fmt.Sprintf(`SELECT (COUNT(DISTINCT ?g) AS ?n) WHERE { GRAPH ?g { ?s ?p ?o } FILTER(STRSTARTS(STR(?g), %q)) }`, g.prefix))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (g *graphStore) field(t *testing.T, b *bundle, id, field string) []string {
	t.Helper()
	rows, err := g.v.Select(b.ctx, fmt.Sprintf(`SELECT ?o WHERE { GRAPH <%s%s> { ?s <%s%s> ?o } }`,
		g.prefix, url.PathEscape(id), sparql.FieldPrefixDefault, field))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		out = append(out, r["o"])
	}
	return out
}

func TestProjectTenThousandRecordsToSPARQL(t *testing.T) {
	t.Parallel()
	n := 10_000
	if testing.Short() {
		n = 2000
	}
	b, g := setupSPARQL(t, projection.Config{Concurrency: 2})
	b.ctx = context.WithoutCancel(b.ctx) // bounded by waitState's progress, not the bundle's 8 minutes
	b.importN(t, n, "Graph")
	c := b.startClient(t)
	start := time.Now()
	b.waitState(t, c, "completed", int64(n))
	t.Logf("projected %d records to Virtuoso in %s", n, time.Since(start).Round(time.Millisecond))
	if got := g.graphs(t, b); got != n {
		t.Fatalf("%d graphs, want %d", got, n)
	}
	if got := g.field(t, b, "r77", "title"); len(got) != 1 || got[0] != "Graph 77" {
		t.Fatalf("r77 title %v", got)
	}
	// A replay of a delivered effect leaves one graph with the same triples.
	var payload []byte
	if err := b.pool.QueryRow(b.ctx, `SELECT payload FROM pgoutbox.effects WHERE payload->>'record_id' = 'r77'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if err := b.app.Handle(b.ctx, &pgoutbox.Delivery{Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if got := g.field(t, b, "r77", "title"); len(got) != 1 || g.graphs(t, b) != n {
		t.Fatalf("after replay: title %v, %d graphs", got, g.graphs(t, b))
	}
}

func TestSPARQLOutOfOrderAndOutage(t *testing.T) {
	t.Parallel()
	b, g := setupSPARQL(t, projection.Config{MaxAttempts: 3})
	b.postJSON(t, "/api/records", `{"id":"o","title":"old"}`)
	b.postJSON(t, "/api/records", `{"id":"o","title":"new"}`)
	older, newer := b.staleThenCurrent(t)
	leases := []*pgoutbox.Lease{older, newer}
	// Newer first, then the older effect: the graph keeps the newer state.
	for _, l := range []*pgoutbox.Lease{leases[1], leases[0]} {
		if err := b.app.Handle(b.ctx, &l.Delivery); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.field(t, b, "o", "title"); len(got) != 1 || got[0] != "new" {
		t.Fatalf("title after out-of-order deliveries: %v", got)
	}

	// An outage: 503 → retries with backoff → dead letter; replay → done.
	g.fail.Store(http.StatusServiceUnavailable)
	b.importN(t, 3, "Outage")
	before := g.calls.Load()
	c := b.startClient(t)
	b.waitState(t, c, "dead_letter", 3)
	if calls := g.calls.Load() - before; calls != 9 {
		t.Errorf("%d update requests during the outage, want 9 (3 effects × 3 attempts)", calls)
	}
	var lastErr string
	if err := b.pool.QueryRow(b.ctx, `SELECT last_error FROM pgoutbox.effects WHERE state = 'dead_letter' LIMIT 1`).Scan(&lastErr); err != nil || !strings.Contains(lastErr, "HTTP 503") {
		t.Fatalf("last_error %q %v", lastErr, err)
	}
	g.fail.Store(0)
	res, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Filter: ops.Filter{Queue: projection.Queue}})
	if err != nil || len(res.Replayed) != 3 {
		t.Fatalf("replay: %v %+v", err, res)
	}
	b.waitState(t, c, "completed", 5)
	if got := g.graphs(t, b); got != 4 {
		t.Fatalf("%d graphs, want 4 (o, r1..r3)", got)
	}
}
