package solrtest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	solr "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func setup(t *testing.T, opts solr.Options) (*solr.Server, *clock) {
	t.Helper()
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if opts.Clock == nil {
		opts.Clock = clk.Now
	}
	s := solr.New(opts)
	t.Cleanup(s.Close)
	return s, clk
}

type answer struct {
	Status int
	Body   map[string]any
	Header http.Header
}

func call(t *testing.T, method, url, ctype, body string, auth ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if len(auth) == 2 {
		req.SetBasicAuth(auth[0], auth[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{Status: resp.StatusCode, Header: resp.Header}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	_ = dec.Decode(&a.Body)
	return a
}

func numFound(t *testing.T, s *solr.Server, q string) float64 {
	t.Helper()
	a := call(t, "GET", s.URL()+"/records/select?q="+q, "", "")
	n, _ := a.Body["response"].(map[string]any)["numFound"].(json.Number).Int64()
	return float64(n)
}

func TestAddReplaceAndCommitWithin(t *testing.T) {
	t.Parallel()
	s, clk := setup(t, solr.Options{})
	u := s.URL() + "/records/update"
	if a := call(t, "POST", u+"?commitWithin=1000", "application/json", `[{"id":"a","t":"one"},{"id":"b","t":"two"}]`); a.Status != 200 {
		t.Fatalf("add: %+v", a)
	}
	if n := numFound(t, s, "*:*"); n != 0 {
		t.Fatalf("visible before commitWithin: %v", n)
	}
	if d := s.Doc("records", "a"); d == nil || d["t"] != "one" {
		t.Fatalf("real-time get: %v", d)
	}
	clk.Add(time.Second)
	if n := numFound(t, s, "*:*"); n != 2 {
		t.Fatalf("after commitWithin: %v", n)
	}
	// Replace by id (uniqueKey), with repeated "add" keys in one object.
	a := call(t, "POST", u+"?commit=true", "application/json", `{"add":{"doc":{"id":"a","t":"uno"}},"add":{"doc":{"id":"c","t":"tres"},"commitWithin":5}}`)
	if a.Status != 200 || s.Count("records") != 3 {
		t.Fatalf("replace: %+v count %d", a, s.Count("records"))
	}
	if n := numFound(t, s, "t:uno"); n != 1 {
		t.Fatalf("t:uno: %v", n)
	}
	if n := numFound(t, s, "t:one"); n != 0 {
		t.Fatalf("old version still found: %v", n)
	}
	// overwrite=false stores a duplicate, like Solr.
	call(t, "POST", u+"?overwrite=false&commit=true", "application/json", `[{"id":"a","t":"dup"}]`)
	if n := numFound(t, s, "id:a"); n != 2 {
		t.Fatalf("overwrite=false: %v docs with id a", n)
	}
	// Delete by id.
	call(t, "POST", u+"?commit=true", "application/json", `{"delete":["a","b"]}`)
	if n := numFound(t, s, "*:*"); n != 1 {
		t.Fatalf("after delete: %v", n)
	}
}

func TestOptimisticConcurrency(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, solr.Options{})
	u := s.URL() + "/records/update?versions=true"
	add := func(body string) answer { return call(t, "POST", u, "application/json", body) }
	if a := add(`{"add":{"doc":{"id":"x","_version_":1}}}`); a.Status != 409 {
		t.Fatalf("_version_=1 on a missing doc: %+v", a)
	}
	a := add(`{"add":{"doc":{"id":"x","_version_":-1}}}`)
	if a.Status != 200 {
		t.Fatalf("_version_=-1 on a missing doc: %+v", a)
	}
	version := func(a answer) int64 { v, _ := a.Body["adds"].([]any)[1].(json.Number).Int64(); return v }
	v1 := version(a)
	if a := add(`{"add":{"doc":{"id":"x","_version_":-1}}}`); a.Status != 409 ||
		!strings.Contains(a.Body["error"].(map[string]any)["msg"].(string), "version conflict for x") {
		t.Fatalf("_version_=-1 on an existing doc: %+v", a)
	}
	if a := add(`{"add":{"doc":{"id":"x","_version_":12345}}}`); a.Status != 409 {
		t.Fatalf("wrong _version_: %+v", a)
	}
	ver := json.Number(s.Doc("records", "x")["_version_"].(json.Number))
	a = add(`{"add":{"doc":{"id":"x","t":"new","_version_":` + ver.String() + `}}}`)
	if a.Status != 200 || version(a) <= v1 {
		t.Fatalf("matching _version_: %+v", a)
	}
	if a := add(`{"add":{"doc":{"id":"x","_version_":1}}}`); a.Status != 200 {
		t.Fatalf("_version_=1 on an existing doc: %+v", a)
	}
	// Commands before a conflict stay applied; the rest are skipped.
	a = add(`{"add":{"doc":{"id":"p"}},"add":{"doc":{"id":"x","_version_":-1}},"add":{"doc":{"id":"q"}}}`)
	if a.Status != 409 || s.Doc("records", "p") == nil || s.Doc("records", "q") != nil {
		t.Fatalf("partial batch: %+v p=%v q=%v", a, s.Doc("records", "p"), s.Doc("records", "q"))
	}
}

func TestAuthAndErrors(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, solr.Options{Username: "solr", Password: "SolrRocks"})
	u := s.URL() + "/records/update"
	if a := call(t, "POST", u, "application/json", `[{"id":"a"}]`); a.Status != 401 || !strings.HasPrefix(a.Header.Get("WWW-Authenticate"), "Basic") {
		t.Fatalf("no auth: %+v", a)
	}
	if a := call(t, "POST", u, "application/json", `[{"id":"a"}]`, "solr", "wrong"); a.Status != 401 {
		t.Fatalf("wrong password: %+v", a)
	}
	if s.Count("records") != 0 {
		t.Fatal("an unauthenticated add was applied")
	}
	ok := []string{"solr", "SolrRocks"}
	for _, tc := range []struct {
		url, ctype, body string
		want             int
	}{
		{u, "application/json", `[{"id":"a"}]`, 200},
		{u, "text/plain", `[{"id":"a"}]`, 415},
		{u, "application/json", `[{"id":`, 400},
		{u, "application/json", `[{"t":"no id"}]`, 400},
		{u, "application/json", `{"frobnicate":{}}`, 400},
		{s.URL() + "/nope/update", "application/json", `[]`, 404},
	} {
		if a := call(t, "POST", tc.url, tc.ctype, tc.body, ok...); a.Status != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.ctype, tc.body, a.Status, tc.want)
		}
	}
	for _, c := range s.Calls() {
		if c.Handler == "" || c.Status == 0 {
			t.Errorf("call log entry %+v", c)
		}
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	s, _ := setup(t, solr.Options{})
	u := s.URL() + "/records/update"
	s.InjectFault(solr.FaultRule{Handler: "update", Times: 1, Kind: solr.FaultStatus, Status: 503, RetryAfter: 7 * time.Second})
	if a := call(t, "POST", u, "application/json", `[{"id":"a"}]`); a.Status != 503 || a.Header.Get("Retry-After") != "7" || s.Count("records") != 0 {
		t.Fatalf("5xx fault: %+v, count %d", a, s.Count("records"))
	}
	if a := call(t, "POST", u, "application/json", `[{"id":"a"}]`); a.Status != 200 {
		t.Fatalf("after the fault's one use: %+v", a)
	}
	s.InjectFault(solr.FaultRule{Handler: "update", Times: 1, Kind: solr.FaultLoseResponse})
	req, _ := http.NewRequest("POST", u, strings.NewReader(`[{"id":"lost"}]`))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("lost response answered")
	}
	if s.Doc("records", "lost") == nil {
		t.Fatal("lose-response did not process the update")
	}
	s.InjectFault(solr.FaultRule{Handler: "get", Kind: solr.FaultDelay, Delay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", s.URL()+"/records/get?id=a", nil)
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("delayed request answered before its delay")
	}
	s.ClearFaults()
	calls := s.Calls()
	var lost, faulted int
	for _, c := range calls {
		if c.Fault == solr.FaultLoseResponse && c.Status == 0 && c.Docs == 1 {
			lost++
		}
		if c.Fault == solr.FaultStatus && c.Status == 503 {
			faulted++
		}
	}
	if lost != 1 || faulted != 1 {
		t.Fatalf("call log: %+v", calls)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	// The delayed call is logged once its handler gives up.
	if err := s.Wait(wctx, func(s *solr.Server) bool {
		for _, c := range s.Calls() {
			if c.Fault == solr.FaultDelay {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDynamicFieldTypesAreChecked(t *testing.T) {
	t.Parallel()
	s := solr.New(solr.Options{Cores: []string{"c"}})
	defer s.Close()
	post := func(body string) int {
		resp, err := http.Post(s.URL()+"/c/update?commitWithin=1000", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`[{"id":"ok","year_i":1999,"price_f":"2.5","seen_b":true,"at_dt":"2026-01-02T03:04:05Z"}]`); code != 200 {
		t.Fatalf("valid typed fields: %d", code)
	}
	for _, bad := range []string{`{"id":"a","year_i":"nineteen"}`, `{"id":"b","flag_b":"yes"}`, `{"id":"c","at_dt":"yesterday"}`, `{"id":"d","n_l":1.5}`} {
		if code := post("[" + bad + "]"); code != 400 {
			t.Errorf("%s: %d, want 400", bad, code)
		}
	}
	if s.Doc("c", "a") != nil {
		t.Fatal("a refused document was stored")
	}
}

// TestFieldNamesFollowTheReferenceGuide: "Field names should consist of
// alphanumeric or underscore characters only and not start with a digit
// ... Names with both leading and trailing underscores (e.g., _version_)
// are reserved." (Solr Reference Guide, Fields.)
func TestFieldNamesFollowTheReferenceGuide(t *testing.T) {
	t.Parallel()
	s := solr.New(solr.Options{Cores: []string{"c"}})
	defer s.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(s.URL()+"/c/update?commitWithin=1000", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(`[{"id":"ok","title":"t","_private":1,"trailing_":2,"a1_B2":3,"_version_":0}]`); code != 200 {
		t.Fatalf("valid names: %d %s", code, body)
	}
	for name, want := range map[string]string{
		"":                 "invalid field name ''",
		"date-created":     "invalid field name 'date-created'",
		"dc.title":         "invalid field name 'dc.title'",
		"with space":       "invalid field name 'with space'",
		"título":           "invalid field name 'título'",
		"1st":              "invalid field name '1st'",
		"_root_":           "field name '_root_' is reserved",
		"_nest_path_":      "field name '_nest_path_' is reserved",
		"_":                "field name '_' is reserved",
		"_childDocuments_": "_childDocuments_ holds child documents",
	} {
		body, _ := json.Marshal([]map[string]any{{"id": "bad", name: "x"}})
		code, msg := post(string(body))
		if code != 400 || !strings.Contains(msg, want) {
			t.Errorf("field %q: %d %s, want 400 with %q", name, code, msg, want)
		}
	}
	if s.Doc("c", "bad") != nil || s.Count("c") != 1 {
		t.Fatalf("a refused document was stored (%d documents)", s.Count("c"))
	}
}
