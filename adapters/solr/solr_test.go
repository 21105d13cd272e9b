package solr_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	fake "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const core = "records"

// setup returns a client on an emulator with basic auth.
func setup(t *testing.T, mod func(*solr.Config)) (*solr.Client, *fake.Server) {
	t.Helper()
	s := fake.New(fake.Options{Username: "solr", Password: "SolrRocks"})
	t.Cleanup(s.Close)
	cfg := solr.Config{BaseURL: s.URL(), Core: core, Username: "solr", Password: "SolrRocks", Timeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	c, err := solr.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, s
}

func doc(version int64, title string) solr.Document {
	return solr.Document{ID: "r1", Version: version, SourceHash: strings.Repeat("a", 63) + string(rune('0'+version)),
		Fields: map[string]any{"id": "r1", "title": title, "meta": map[string]any{"k": "v"}, "tags": []any{"x", "y"}, "_version_": json.Number("5")}}
}

func outcome(err error) pgoutbox.Outcome {
	var oe *pgoutbox.OutcomeError
	if errors.As(err, &oe) {
		return oe.Outcome
	}
	return ""
}

func updates(s *fake.Server) int {
	n := 0
	for _, c := range s.Calls() {
		if c.Handler == "update" {
			n++
		}
	}
	return n
}

func TestUpsertReplayAndOutOfOrder(t *testing.T) {
	t.Parallel()
	c, s := setup(t, nil)
	ctx := context.Background()
	if res, err := c.Upsert(ctx, doc(1, "first")); err != nil || res != solr.Written {
		t.Fatalf("first: %v %v", res, err)
	}
	d := s.Doc(core, "r1")
	if d["title"] != "first" || d[solr.VersionField] != json.Number("1") || d["meta"] != `{"k":"v"}` {
		t.Fatalf("stored: %v", d)
	}
	// A replay of the same version sends nothing and leaves one document.
	if res, err := c.Upsert(ctx, doc(1, "first")); err != nil || res != solr.AlreadyCurrent {
		t.Fatalf("replay: %v %v", res, err)
	}
	if updates(s) != 1 || s.Count(core) != 1 {
		t.Fatalf("replay: %d updates, %d docs", updates(s), s.Count(core))
	}
	if res, err := c.Upsert(ctx, doc(3, "third")); err != nil || res != solr.Written {
		t.Fatalf("v3: %v %v", res, err)
	}
	// Version 2 arriving after version 3 never wins.
	if res, err := c.Upsert(ctx, doc(2, "second")); err != nil || res != solr.SkippedNewer {
		t.Fatalf("older: %v %v", res, err)
	}
	if d := s.Doc(core, "r1"); d["title"] != "third" || s.Count(core) != 1 {
		t.Fatalf("after an out-of-order older update: %v", d)
	}
	// commitWithin: the add carries it (the emulator makes it searchable
	// after the deadline).
	for _, call := range s.Calls() {
		if call.Handler == "update" && call.Status != 200 {
			t.Fatalf("update call %+v", call)
		}
	}
}

// racer changes the document between the client's real-time get and its
// add, once, so that the add's _version_ no longer matches.
type racer struct {
	next http.RoundTripper
	s    *fake.Server
	url  string
	done bool
}

func (r *racer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPost && !r.done {
		r.done = true
		body := strings.NewReader(`{"add":{"doc":{"id":"r1","title":"concurrent","pgoutbox_version_l":9}}}`)
		creq, _ := http.NewRequest(http.MethodPost, r.url, body)
		creq.Header.Set("Content-Type", "application/json")
		creq.SetBasicAuth("solr", "SolrRocks")
		resp, err := r.next.RoundTrip(creq)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
	}
	return r.next.RoundTrip(req)
}

func TestConflictRereadsAndKeepsNewer(t *testing.T) {
	t.Parallel()
	s := fake.New(fake.Options{Username: "solr", Password: "SolrRocks"})
	t.Cleanup(s.Close)
	rt := &racer{next: http.DefaultTransport, s: s, url: s.URL() + "/" + core + "/update"}
	c, err := solr.New(solr.Config{BaseURL: s.URL(), Core: core, Username: "solr", Password: "SolrRocks",
		HTTPClient: &http.Client{Transport: rt, Timeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Upsert(context.Background(), doc(2, "mine"))
	if err != nil || res != solr.SkippedNewer {
		t.Fatalf("after a conflict with a newer writer: %v %v", res, err)
	}
	var conflicts int
	for _, call := range s.Calls() {
		if call.Status == http.StatusConflict {
			conflicts++
		}
	}
	if conflicts != 1 || s.Doc(core, "r1")["title"] != "concurrent" {
		t.Fatalf("conflicts %d, doc %v", conflicts, s.Doc(core, "r1"))
	}
}

func TestClassification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, s := setup(t, nil)
	s.InjectFault(fake.FaultRule{Handler: "update", Times: 1, Kind: fake.FaultStatus, Status: 500})
	if _, err := c.Upsert(ctx, doc(1, "x")); outcome(err) != pgoutbox.OutcomeRetry {
		t.Fatalf("500: %v", err)
	}
	s.InjectFault(fake.FaultRule{Handler: "get", Times: 1, Kind: fake.FaultStatus, Status: 503, RetryAfter: 30 * time.Second})
	_, err := c.Upsert(ctx, doc(1, "x"))
	var oe *pgoutbox.OutcomeError
	if !errors.As(err, &oe) || oe.Outcome != pgoutbox.OutcomeRetryAfter || oe.After != 30*time.Second {
		t.Fatalf("503 Retry-After: %v", err)
	}
	s.InjectFault(fake.FaultRule{Handler: "update", Times: 1, Kind: fake.FaultStatus, Status: 400})
	if _, err := c.Upsert(ctx, doc(1, "x")); outcome(err) != pgoutbox.OutcomePermanent {
		t.Fatalf("400: %v", err)
	}
	s.InjectFault(fake.FaultRule{Handler: "update", Times: 1, Kind: fake.FaultLoseResponse})
	if _, err := c.Upsert(ctx, doc(1, "x")); outcome(err) != pgoutbox.OutcomeAmbiguous {
		t.Fatalf("lost response: %v", err)
	}
	// The lost add was applied: the retry finds it current.
	if res, err := c.Upsert(ctx, doc(1, "x")); err != nil || res != solr.AlreadyCurrent || s.Count(core) != 1 {
		t.Fatalf("retry after a lost response: %v %v", res, err)
	}

	bad, _ := setup(t, func(c *solr.Config) { c.Password = "wrong-password" })
	_, err = bad.Upsert(ctx, doc(1, "x"))
	if outcome(err) != pgoutbox.OutcomePermanent || strings.Contains(err.Error(), "wrong-password") {
		t.Fatalf("bad credentials: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  solr.Config
		want string
	}{
		{solr.Config{Core: "c"}, "solr: Config.BaseURL is empty"},
		{solr.Config{BaseURL: "ftp://x", Core: "c"}, "solr: Config.BaseURL is not an http(s) URL"},
		{solr.Config{BaseURL: "http://u:p@x/solr", Core: "c"}, "solr: Config.BaseURL must not carry credentials: set Config.Username and Config.Password"},
		{solr.Config{BaseURL: "http://x/solr"}, "solr: Config.Core is empty"},
		{solr.Config{BaseURL: "http://x/solr", Core: "c", Password: "p"}, "solr: Config.Password is set but Config.Username is empty"},
	} {
		// The library names Go fields, never environment variables (the
		// application that reads the environment maps them).
		if err := tc.cfg.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
		if _, err := solr.New(tc.cfg); err == nil || err.Error() != tc.want {
			t.Errorf("New(%+v): %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := (solr.Config{BaseURL: "http://x/solr", Core: "c"}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestFieldNamesSolrRefusesAreMapped: reserved and invalid record field
// names reach Solr under FieldName's deterministic, one-to-one mapping,
// which the emulator (enforcing the reference guide's rules) accepts; no
// field is dropped and none overrides the handler's own.
func TestFieldNamesSolrRefusesAreMapped(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"title": "title", "_private": "_private", "a1_B2": "a1_B2",
		"":                   "pgoutbox_x_",
		"_childDocuments_":   "pgoutbox_x___childDocuments__",
		"_version_":          "pgoutbox_x___version__",
		"date-created":       "pgoutbox_x_date_2dcreated",
		"1st":                "pgoutbox_x_1st",
		"título":             "pgoutbox_x_t_c3_adtulo",
		"pgoutbox_version_l": "pgoutbox_x_pgoutbox__version__l",
	} {
		if got := solr.FieldName(name); got != want {
			t.Errorf("FieldName(%q) = %q, want %q", name, got, want)
		}
	}
	// One-to-one over names built to collide under a careless escaping.
	seen := map[string]string{}
	for _, name := range []string{"", "_", "__", "___", "a-b", "a_2db", "a__2db", "a_b", "a__b", "_a_", "__a__",
		"pgoutbox_x_", "pgoutbox_x__", "x", "pgoutbox_", "a.b", "a_2eb", "é", "_c3_a9", "a-b.", "a_2db."} {
		got := solr.FieldName(name)
		if other, dup := seen[got]; dup {
			t.Errorf("FieldName(%q) = FieldName(%q) = %q", name, other, got)
		}
		seen[got] = name
	}

	c, s := setup(t, nil)
	fields := map[string]any{"id": "r1", "title": "kept", "_childDocuments_": "not a child", "": "empty",
		"date-created": "2026", "_root_": "r", "pgoutbox_version_l": json.Number("99"), "título": "t"}
	res, err := c.Upsert(context.Background(), solr.Document{ID: "r1", Version: 4, SourceHash: "h", Fields: fields})
	if err != nil || res != solr.Written {
		t.Fatalf("upsert: %v %v", res, err)
	}
	d := s.Doc(core, "r1")
	for name, v := range fields {
		if name == "id" {
			continue
		}
		if d[solr.FieldName(name)] != v {
			t.Errorf("field %q: Solr holds %v under %q, want %v", name, d[solr.FieldName(name)], solr.FieldName(name), v)
		}
	}
	if d[solr.VersionField] != json.Number("4") || d["id"] != "r1" {
		t.Errorf("the handler's fields were overridden: %v", d)
	}
}

// TestRetryAfterHTTPDate: Solr's 429 and 503 with a Retry-After HTTP-date
// (RFC 9110) are retried no earlier than that date, measured from the
// answer's Date and not this host's clock (httpout's tests hold the
// parser's cases).
func TestRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	for status, retryAfter := range map[int]string{429: "Tue, 01 Dec 2026 09:00:45 GMT", 503: "Tuesday, 01-Dec-26 09:00:45 GMT"} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Date", "Tue, 01 Dec 2026 09:00:00 GMT")
			w.Header().Set("Retry-After", retryAfter)
			http.Error(w, `{"error":{"msg":"busy"}}`, status)
		}))
		c, err := solr.New(solr.Config{BaseURL: srv.URL + "/solr", Core: core})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Upsert(context.Background(), doc(1, "x"))
		srv.Close()
		if oe := (*pgoutbox.OutcomeError)(nil); !errors.As(err, &oe) || oe.After != 45*time.Second || !strings.Contains(err.Error(), "busy") {
			t.Errorf("HTTP %d Retry-After %q: %v, want a retry after 45s", status, retryAfter, err)
		}
	}
}
