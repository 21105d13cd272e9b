package sparql_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
	"github.com/pgoutbox/pgoutbox/adapters/sparql/sparqltest"
)

func TestMain(m *testing.M) {
	sparqltest.Main(m, func() error { return goleak.Find() })
}

func newClient(t *testing.T, cfg sparql.Config) *sparql.Client {
	t.Helper()
	c, err := sparql.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestUpdateText(t *testing.T) {
	t.Parallel()
	c := newClient(t, sparql.Config{BaseURL: "http://graphdb:7200", RepositoryID: "museum"})
	u := c.Update(sparql.Document{ID: "a b/é", Version: 3, SourceHash: "h", Fields: map[string]any{
		"title": "say \"hi\"\n", "n": json.Number("42"), "f": json.Number("1.5"), "ok": true,
		"tags": []any{"x", "y"}, "meta": map[string]any{"k": "v"}, "nil": nil,
	}})
	g := "urn:pgoutbox:record:a%20b%2F%C3%A9"
	for _, want := range []string{
		"DROP SILENT GRAPH <" + g + "> ;\nINSERT DATA { GRAPH <" + g + "> {",
		`<urn:pgoutbox:field:title> "say \"hi\"\n" .`,
		`<urn:pgoutbox:field:n> "42"^^<http://www.w3.org/2001/XMLSchema#integer>`,
		`<urn:pgoutbox:field:f> "1.5"^^<http://www.w3.org/2001/XMLSchema#decimal>`,
		`<urn:pgoutbox:field:ok> "true"^^<http://www.w3.org/2001/XMLSchema#boolean>`,
		`<urn:pgoutbox:field:tags> "x" .`, `<urn:pgoutbox:field:tags> "y" .`,
		`<urn:pgoutbox:field:meta> "{\"k\":\"v\"}"^^<http://www.w3.org/1999/02/22-rdf-syntax-ns#JSON>`,
		`<urn:pgoutbox:meta:version> "3"^^<http://www.w3.org/2001/XMLSchema#integer>`,
	} {
		if !strings.Contains(u, want) {
			t.Errorf("update lacks %q:\n%s", want, u)
		}
	}
	if strings.Contains(u, "field:nil") {
		t.Error("null became a triple")
	}
	if got := (sparql.Config{BaseURL: "http://graphdb:7200/", RepositoryID: "museum"}).Endpoint(); got != "http://graphdb:7200/repositories/museum/statements" {
		t.Errorf("GraphDB endpoint %s", got)
	}
}

func TestRequestAndClassification(t *testing.T) {
	t.Parallel()
	var got *http.Request
	var form string
	status := 204
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		_ = r.ParseForm()
		form = r.PostForm.Get("update")
		w.Header().Set("Date", "Tue, 01 Dec 2026 09:00:00 GMT")
		switch status {
		case 503:
			w.Header().Set("Retry-After", "9")
		case 429: // an HTTP-date (RFC 9110), measured from Date
			w.Header().Set("Retry-After", "Tue, 01 Dec 2026 09:00:45 GMT")
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	c := newClient(t, sparql.Config{BaseURL: srv.URL, RepositoryID: "repo", Username: "admin", Password: "s3cret-pw"})
	ctx := context.Background()
	doc := sparql.Document{ID: "r1", Version: 1, SourceHash: "h", Fields: map[string]any{"t": "x"}}
	if err := c.Upsert(ctx, doc); err != nil {
		t.Fatal(err)
	}
	user, pass, ok := got.BasicAuth()
	if got.URL.Path != "/repositories/repo/statements" || !ok || user != "admin" || pass != "s3cret-pw" ||
		!strings.HasPrefix(got.Header.Get("Content-Type"), "application/x-www-form-urlencoded") ||
		!strings.HasPrefix(form, "DROP SILENT GRAPH <urn:pgoutbox:record:r1> ;") {
		t.Fatalf("request: %s %v %q", got.URL.Path, got.Header, form)
	}
	for _, tc := range []struct {
		status int
		want   pgoutbox.Outcome
		after  time.Duration
	}{
		{500, pgoutbox.OutcomeRetry, 0}, {503, pgoutbox.OutcomeRetryAfter, 9 * time.Second},
		{429, pgoutbox.OutcomeRetryAfter, 45 * time.Second}, // before the shared parser: a plain retry
		{400, pgoutbox.OutcomePermanent, 0}, {401, pgoutbox.OutcomePermanent, 0},
	} {
		status = tc.status
		err := c.Upsert(ctx, doc)
		var oe *pgoutbox.OutcomeError
		if !errors.As(err, &oe) || oe.Outcome != tc.want || oe.After != tc.after || strings.Contains(err.Error(), "s3cret-pw") {
			t.Errorf("HTTP %d: %v, want %s after %s", tc.status, err, tc.want, tc.after)
		}
	}
	srv.Close()
	var oe *pgoutbox.OutcomeError
	if err := c.Upsert(ctx, doc); !errors.As(err, &oe) || oe.Outcome != pgoutbox.OutcomeAmbiguous {
		t.Errorf("connection refused: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  sparql.Config
		want string
	}{
		{sparql.Config{RepositoryID: "r"}, "sparql: Config.BaseURL is empty (or set Config.UpdateURL)"},
		{sparql.Config{BaseURL: "http://g"}, "sparql: Config.RepositoryID is empty (or set Config.UpdateURL)"},
		{sparql.Config{UpdateURL: "http://u:p@v/sparql"}, "sparql: the update URL (Config.UpdateURL or Config.BaseURL) must not carry credentials: set Config.Username and Config.Password"},
		{sparql.Config{UpdateURL: "file:///x"}, "sparql: the update URL (Config.UpdateURL or Config.BaseURL) is not an http(s) URL"},
		{sparql.Config{UpdateURL: "http://v/sparql", Password: "p"}, "sparql: Config.Password is set but Config.Username is empty"},
		{sparql.Config{UpdateURL: "http://v/sparql", GraphStoreURL: "ftp://v/gsp"}, "sparql: Config.GraphStoreURL is not an http(s) URL"},
		{sparql.Config{UpdateURL: "http://v/sparql", GraphStoreURL: "http://u:p@v/gsp"}, "sparql: Config.GraphStoreURL must not carry credentials: set Config.Username and Config.Password"},
		{sparql.Config{UpdateURL: "http://v/sparql", GraphPrefix: "urn:x> <urn:y"}, `sparql: Config.GraphPrefix "urn:x> <urn:y" holds ">", which an IRI may not`},
		{sparql.Config{UpdateURL: "http://v/sparql", FieldPrefix: `urn:\u003E`}, `sparql: Config.FieldPrefix "urn:\\u003E" holds "\\", which an IRI may not`},
	} {
		// The library names Go fields, never environment variables (the
		// application that reads the environment maps them).
		if err := tc.cfg.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
		if _, err := sparql.New(tc.cfg); err == nil || err.Error() != tc.want {
			t.Errorf("New(%+v): %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// triples counts the triples of a record's graph in Virtuoso.
func triples(t *testing.T, v *sparqltest.Server, c *sparql.Client, id string) int {
	t.Helper()
	n, err := v.Count(context.Background(), fmt.Sprintf("SELECT (COUNT(*) AS ?n) WHERE { GRAPH <%s> { ?s ?p ?o } }", c.GraphIRI(id)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestVirtuosoReplaceAndReplay(t *testing.T) {
	t.Parallel()
	v := sparqltest.Start(t)
	prefix := fmt.Sprintf("urn:test:%d:", time.Now().UnixNano())
	c := newClient(t, sparql.Config{UpdateURL: v.SPARQLURL, GraphPrefix: prefix})
	ctx := context.Background()
	doc := sparql.Document{ID: "rec 1", Version: 1, SourceHash: "h1", Fields: map[string]any{
		"title": "Tête \"quoted\"\nline", "year": json.Number("1503"), "tags": []any{"a", "b"}, "meta": map[string]any{"k": 1},
	}}
	if err := c.Upsert(ctx, doc); err != nil {
		t.Fatal(err)
	}
	// version, hash, title, year, 2 tags, meta.
	if n := triples(t, v, c, "rec 1"); n != 7 {
		t.Fatalf("%d triples after the first upsert, want 7", n)
	}
	// A replay leaves exactly the same graph.
	if err := c.Upsert(ctx, doc); err != nil {
		t.Fatal(err)
	}
	if n := triples(t, v, c, "rec 1"); n != 7 {
		t.Fatalf("%d triples after a replay, want 7", n)
	}
	// A new version replaces the graph: no triple of the old one remains.
	doc2 := sparql.Document{ID: "rec 1", Version: 2, SourceHash: "h2", Fields: map[string]any{"title": "new"}}
	if err := c.Upsert(ctx, doc2); err != nil {
		t.Fatal(err)
	}
	rows, err := v.Select(ctx, fmt.Sprintf("SELECT ?p ?o WHERE { GRAPH <%s> { ?s ?p ?o } }", c.GraphIRI("rec 1")))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("after v2: %v", rows)
	}
	for _, r := range rows {
		if r["p"] == "urn:pgoutbox:field:title" && r["o"] != "new" {
			t.Fatalf("title %q", r["o"])
		}
		if r["p"] == sparql.VersionPredicate && r["o"] != "2" {
			t.Fatalf("version %q", r["o"])
		}
	}
	graphs, err := v.Count(ctx, fmt.Sprintf(`SELECT (COUNT(DISTINCT ?g) AS ?n) WHERE { GRAPH ?g { ?s ?p ?o } FILTER(STRSTARTS(STR(?g), %q)) }`, prefix))
	if err != nil || graphs != 1 {
		t.Fatalf("%d graphs, want 1 (%v)", graphs, err)
	}
}
