package githubtest_test

import (
	"net/http"
	"strings"
	"testing"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

// TestCheckRunListPaginatesAsGitHub: per_page defaults to 30 and is capped
// at 100; the Link header names prev, next, last and first only where they
// apply and is absent when one page holds everything; a page past the end
// is empty.
func TestCheckRunListPaginatesAsGitHub(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	for range 250 {
		if r := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "rel", "head_sha": sha}); r.status != http.StatusCreated {
			t.Fatalf("create: HTTP %d", r.status)
		}
	}
	list := func(query string) (checkRunList, string) {
		t.Helper()
		r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/"+sha+"/check-runs?filter=all&check_name=rel"+query, b.token, nil)
		if r.status != http.StatusOK {
			t.Fatalf("list %s: HTTP %d %s", query, r.status, r.body)
		}
		var l checkRunList
		r.decode(t, &l)
		return l, r.header.Get("Link")
	}
	base := b.srv.URL() + "/repos/acme/widgets/commits/" + sha + "/check-runs?check_name=rel&filter=all"
	if l, link := list(""); len(l.CheckRuns) != 30 || l.TotalCount != 250 ||
		link != `<`+base+`&page=2&per_page=30>; rel="next", <`+base+`&page=9&per_page=30>; rel="last"` {
		t.Errorf("default page: %d runs of %d, Link %q", len(l.CheckRuns), l.TotalCount, link)
	}
	seen := map[int64]bool{}
	l, link := list("&per_page=500")
	if len(l.CheckRuns) != 100 || link != `<`+base+`&page=2&per_page=100>; rel="next", <`+base+`&page=3&per_page=100>; rel="last"` {
		t.Errorf("per_page=500: %d runs, Link %q (want 100, capped)", len(l.CheckRuns), link)
	}
	for _, cr := range l.CheckRuns {
		seen[cr.ID] = true
	}
	l, link = list("&per_page=100&page=2")
	if len(l.CheckRuns) != 100 || !strings.Contains(link, `page=1&per_page=100>; rel="prev"`) ||
		!strings.Contains(link, `page=3&per_page=100>; rel="next"`) || !strings.Contains(link, `rel="first"`) {
		t.Errorf("page 2: %d runs, Link %q", len(l.CheckRuns), link)
	}
	for _, cr := range l.CheckRuns {
		seen[cr.ID] = true
	}
	l, link = list("&per_page=100&page=3")
	if len(l.CheckRuns) != 50 || strings.Contains(link, `rel="next"`) || strings.Contains(link, `rel="last"`) ||
		!strings.Contains(link, `page=2&per_page=100>; rel="prev"`) || !strings.Contains(link, `page=1&per_page=100>; rel="first"`) {
		t.Errorf("last page: %d runs, Link %q", len(l.CheckRuns), link)
	}
	for _, cr := range l.CheckRuns {
		seen[cr.ID] = true
	}
	if len(seen) != 250 {
		t.Errorf("three pages held %d distinct runs, want 250", len(seen))
	}
	if l, _ := list("&per_page=100&page=4"); len(l.CheckRuns) != 0 || l.CheckRuns == nil || l.TotalCount != 250 {
		t.Errorf("past the end: %+v", l)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/"+sha+"/check-runs?check_name=none", b.token, nil); r.status != http.StatusOK || r.header.Get("Link") != "" {
		t.Errorf("one page: HTTP %d, Link %q, want none", r.status, r.header.Get("Link"))
	}
}

// TestWorkflowRunListSearchLimit: "This endpoint will return up to 1,000
// results for each search when using the following parameters: actor,
// branch, check_suite_id, created, event, head_sha, status."
func TestWorkflowRunListSearchLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{RateLimit: 100_000})
	for i := range fakegh.SearchLimit + 5 {
		if r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, i+1)}); r.status != http.StatusNoContent {
			t.Fatalf("dispatch: HTTP %d %s", r.status, r.body)
		}
	}
	list := func(query string) (runList, string) {
		t.Helper()
		r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/workflows/release.yml/runs?"+query, b.token, nil)
		if r.status != http.StatusOK {
			t.Fatalf("list %s: HTTP %d %s", query, r.status, r.body)
		}
		var l runList
		r.decode(t, &l)
		return l, r.header.Get("Link")
	}
	l, link := list("event=workflow_dispatch&per_page=100&page=10")
	if len(l.WorkflowRuns) != 100 || l.TotalCount != fakegh.SearchLimit+5 || strings.Contains(link, `rel="next"`) {
		t.Errorf("filtered page 10: %d runs of %d, Link %q; want the last 100 of 1,000 and no next", len(l.WorkflowRuns), l.TotalCount, link)
	}
	if l, _ := list("event=workflow_dispatch&per_page=100&page=11"); len(l.WorkflowRuns) != 0 {
		t.Errorf("filtered page 11: %d runs, want none", len(l.WorkflowRuns))
	}
	if l, link := list("per_page=100&page=11"); len(l.WorkflowRuns) != 5 || !strings.Contains(link, `rel="prev"`) {
		t.Errorf("unfiltered page 11: %d runs, Link %q; want the 5 oldest", len(l.WorkflowRuns), link)
	}
}
