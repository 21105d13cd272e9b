package projection_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/projection"
)

func TestPostRecordIdenticalRepostEnqueuesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{})
	code, out := b.postJSON(t, "/api/records", `{"id":"r1","title":"Mona Lisa","year":1503}`)
	if code != http.StatusCreated {
		t.Fatalf("first post: %d %s", code, out)
	}
	first := decode[projection.RecordResponse](t, out)
	if first.Status != "created" || first.Version != 1 || first.EffectID == 0 {
		t.Fatalf("first post: %+v", first)
	}
	var key, payload string
	if err := b.pool.QueryRow(b.ctx, `SELECT idempotency_key, payload::text FROM pgoutbox.effects WHERE id = $1`, first.EffectID).
		Scan(&key, &payload); err != nil {
		t.Fatal(err)
	}
	if want := pgoutbox.Key("record.upsert", "r1", first.SourceHash); key != want {
		t.Fatalf("key %s, want sha256(record.upsert|r1|hash) %s", key, want)
	}
	if strings.Contains(payload, "Mona") {
		t.Fatalf("payload carries record content: %s", payload)
	}

	// The same record, keys reordered and spaced differently: same hash.
	before := b.counts(t)
	code, out = b.postJSON(t, "/api/records", `{ "year": 1503, "title": "Mona Lisa", "id": "r1" }`)
	again := decode[projection.RecordResponse](t, out)
	if code != http.StatusOK || again.Status != "unchanged" || again.SourceHash != first.SourceHash || again.EffectID != 0 {
		t.Fatalf("identical re-post: %d %+v", code, again)
	}
	if after := b.counts(t); after != before {
		t.Fatalf("identical re-post wrote: %v → %v", before, after)
	}
	if v := b.scalar(t, `SELECT version FROM storage_documents.records WHERE id = 'r1'`); v != 1 {
		t.Fatalf("version %d after identical re-post", v)
	}

	// A change: version 2, one more effect.
	code, out = b.postJSON(t, "/api/records", `{"id":"r1","title":"La Joconde","year":1503}`)
	changed := decode[projection.RecordResponse](t, out)
	if code != http.StatusOK || changed.Status != "updated" || changed.Version != 2 || changed.EffectID == first.EffectID {
		t.Fatalf("change: %d %+v", code, changed)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`); n != 2 {
		t.Fatalf("%d effects after a change, want 2", n)
	}
}

func TestRevertAfterDeliveryEnqueuesFollowUp(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{})
	a := `{"id":"r","v":"a"}`
	b.postJSON(t, "/api/records", a)
	b.postJSON(t, "/api/records", `{"id":"r","v":"b"}`)
	// Back to "a" while its effect still waits: the waiting effect will
	// project the current state, so nothing new is needed.
	code, out := b.postJSON(t, "/api/records", a)
	if r := decode[projection.RecordResponse](t, out); code != 200 || r.Status != "updated" || r.Version != 3 {
		t.Fatalf("revert: %d %+v", code, r)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects`); n != 2 {
		t.Fatalf("%d effects, want 2", n)
	}
	// Deliver everything, then change and revert again: the revert's key
	// names a completed effect, so a follow-up effect is enqueued.
	if n := b.completeAll(t); n != 2 {
		t.Fatalf("completed %d effects, want 2", n)
	}
	b.postJSON(t, "/api/records", `{"id":"r","v":"b"}`)
	code, out = b.postJSON(t, "/api/records", a)
	r := decode[projection.RecordResponse](t, out)
	if code != 200 || r.Version != 5 || r.EffectID == 0 {
		t.Fatalf("second revert: %d %+v", code, r)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available'`); n != 2 {
		t.Fatalf("%d available effects after change+revert of delivered content, want 2", n)
	}
}

func TestRecordsAPIAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{})
	unconfigured := setup(t, projection.Config{APIToken: "-"})
	// Wrong tokens draw on one budget per address (5): each wrong-token
	// case gets an application of its own.
	other := setup(t, projection.Config{})
	for _, tc := range []struct {
		name string
		b    *bundle
		auth string
		want int
	}{
		{"token unset", unconfigured, "Bearer " + token, http.StatusServiceUnavailable},
		{"no header", b, "", http.StatusUnauthorized},
		{"wrong token", b, "Bearer nope", http.StatusUnauthorized},
		{"token prefix", other, "Bearer " + token[:len(token)-1], http.StatusUnauthorized},
		{"basic scheme", b, "Basic " + token, http.StatusUnauthorized},
	} {
		before := tc.b.counts(t)
		for _, path := range []string{"/api/records", "/api/import"} {
			code, out, hdr := tc.b.do(t, http.MethodPost, path, "application/json", strings.NewReader(`{"id":"x"}`), "Authorization", tc.auth)
			if code != tc.want {
				t.Errorf("%s %s: %d %s, want %d", tc.name, path, code, out, tc.want)
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s: no Bearer challenge", tc.name)
			}
			if tc.want == http.StatusServiceUnavailable && !strings.Contains(string(out), "not configured") {
				t.Errorf("%s: %s", tc.name, out)
			}
		}
		code, _, _ := tc.b.do(t, http.MethodGet, "/api/records/x", "", nil, "Authorization", tc.auth)
		if code != tc.want {
			t.Errorf("%s GET: %d", tc.name, code)
		}
		if after := tc.b.counts(t); after != before {
			t.Errorf("%s wrote: %v → %v", tc.name, before, after)
		}
	}
	// b has compared 3 wrong tokens from this address: 2 more are 401, then
	// every token, the right one too, is 429 with Retry-After, uncompared.
	before := b.counts(t)
	for i, want := range []int{http.StatusUnauthorized, http.StatusUnauthorized, http.StatusTooManyRequests} {
		if code, out, _ := b.do(t, http.MethodGet, "/api/records/x", "", nil, "Authorization", "Bearer guess"); code != want {
			t.Fatalf("wrong token %d: %d %s, want %d", 4+i, code, out, want)
		}
	}
	code, _, hdr := b.do(t, http.MethodPost, "/api/records", "application/json", strings.NewReader(`{"id":"x"}`), "Authorization", "Bearer "+token)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Fatalf("the right token past the budget: %d (Retry-After %q), want 429 with Retry-After", code, hdr.Get("Retry-After"))
	}
	if after := b.counts(t); after != before {
		t.Errorf("past the budget wrote: %v → %v", before, after)
	}
}

func TestPostRecordBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{MaxRecordBytes: 1024})
	for _, tc := range []struct {
		name, ctype, body string
		want              int
		msg               string
	}{
		{"malformed", "application/json", `{"id": "x",`, 400, "invalid JSON"},
		{"not an object", "application/json", `["x"]`, 400, "JSON object"},
		{"no id", "application/json", `{"title":"x"}`, 400, `missing "id"`},
		{"empty id", "application/json", `{"id":"  "}`, 400, `"id" is empty`},
		{"bool id", "application/json", `{"id":true}`, 400, `"id" must be`},
		{"two values", "application/json", `{"id":"a"} {"id":"b"}`, 400, "more than one"},
		{"NUL", "application/json", `{"id":"a","t":"x\u0000y"}`, 400, `\u0000`},
		{"wrong type", "text/plain", `{"id":"x"}`, 415, "application/json"},
		{"no type", "", `{"id":"x"}`, 415, "application/json"},
		// Issue 27, point 6: bounded before anything parses into jsonb.
		{"too deep", "application/json", `{"id":"x","d":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`, 400, "nests deeper than 64 levels"},
		{"huge exponent", "application/json", `{"id":"x","n":1e131071}`, 400, "exponent beyond ±400"},
		{"long number", "application/json", `{"id":"x","n":` + strings.Repeat("9", 101) + `}`, 400, "longer than 100 characters"},
		{"oversize", "application/json", `{"id":"x","t":"` + strings.Repeat("a", 2000) + `"}`, 413, "limit"},
	} {
		before := b.counts(t)
		code, out, _ := b.do(t, http.MethodPost, "/api/records", tc.ctype, strings.NewReader(tc.body))
		if e := decode[struct{ Error string }](t, out); code != tc.want || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("%s: %d %s, want %d with %q", tc.name, code, out, tc.want, tc.msg)
		}
		if after := b.counts(t); after != before {
			t.Errorf("%s wrote: %v → %v", tc.name, before, after)
		}
	}
}

func TestGetAndSearchRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{})
	for i, title := range []string{"Starry Night over the Rhone", "The Night Watch", "Water Lilies"} {
		if code, out := b.postJSON(t, "/api/records", fmt.Sprintf(`{"id":"p%d","title":%q,"tags":["painting"]}`, i, title)); code != 201 {
			t.Fatalf("post: %d %s", code, out)
		}
	}
	code, out, _ := b.do(t, http.MethodGet, "/api/records/p1", "", nil)
	rec := decode[projection.Record](t, out)
	if code != 200 || rec.ID != "p1" || rec.Version != 1 || !strings.Contains(string(rec.Document), "Night Watch") {
		t.Fatalf("get: %d %s", code, out)
	}
	if code, _, _ := b.do(t, http.MethodGet, "/api/records/nope", "", nil); code != 404 {
		t.Fatalf("missing record: %d", code)
	}
	code, out, _ = b.do(t, http.MethodGet, "/api/records?q=night", "", nil)
	res := decode[projection.SearchResponse](t, out)
	if code != 200 || len(res.Records) != 2 {
		t.Fatalf("search night: %d %s", code, out)
	}
	code, out, _ = b.do(t, http.MethodGet, "/api/records?q=lilies", "", nil)
	if res = decode[projection.SearchResponse](t, out); code != 200 || len(res.Records) != 1 || res.Records[0].ID != "p2" {
		t.Fatalf("search lilies: %d %s", code, out)
	}
	code, out, _ = b.do(t, http.MethodGet, "/api/records?limit=2", "", nil)
	if res = decode[projection.SearchResponse](t, out); code != 200 || len(res.Records) != 2 || res.Next != "p1" {
		t.Fatalf("list: %d %s", code, out)
	}
	code, out, _ = b.do(t, http.MethodGet, "/api/records?limit=2&after=p1", "", nil)
	if res = decode[projection.SearchResponse](t, out); code != 200 || len(res.Records) != 1 || res.Records[0].ID != "p2" {
		t.Fatalf("page 2: %d %s", code, out)
	}
	if code, _, _ := b.do(t, http.MethodGet, "/api/records?limit=0", "", nil); code != 400 {
		t.Fatalf("limit=0: %d", code)
	}
}
