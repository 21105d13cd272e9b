package github_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

const testSHA = "0123456789abcdef0123456789abcdef01234567"

// emulatorClient returns the GitHub emulator with installation 77 owning
// acme/widgets, and a Client for it.
func emulatorClient(t *testing.T) (*fakegh.Server, *github.Client) {
	t.Helper()
	gh := fakegh.New(fakegh.Options{RateLimit: 100_000})
	t.Cleanup(gh.Close)
	if err := gh.AddInstallation(77, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := gh.AddRepository(77, 700, "acme/widgets"); err != nil {
		t.Fatal(err)
	}
	key, err := github.ParsePrivateKey(gh.AppPrivateKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	ts, err := github.NewTokenSource(gh.Client(), gh.URL(), gh.AppID(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	return gh, github.NewClient(gh.Client(), gh.URL(), ts)
}

// callsTo returns the emulator's calls of route.
func callsTo(gh *fakegh.Server, route string) []fakegh.Call {
	var out []fakegh.Call
	for _, c := range gh.Calls() {
		if c.Route == route {
			out = append(out, c)
		}
	}
	return out
}

func outcome(err error) pgoutbox.Outcome {
	var oe *pgoutbox.OutcomeError
	if errors.As(err, &oe) {
		return oe.Outcome
	}
	return ""
}

// TestCompleteCheckRunMapsEveryConclusion sends every workflow-run
// conclusion GitHub documents (and null, and an unknown one) through
// CheckRunConclusion to the emulator, which refuses "stale" with 422 as
// GitHub's "Update a check run" does.
func TestCompleteCheckRunMapsEveryConclusion(t *testing.T) {
	t.Parallel()
	gh, c := emulatorClient(t)
	ctx := t.Context()
	for _, tc := range []struct{ workflow, check string }{
		{"success", "success"}, {"failure", "failure"}, {"neutral", "neutral"},
		{"cancelled", "cancelled"}, {"skipped", "skipped"}, {"timed_out", "timed_out"},
		{"action_required", "action_required"}, {"stale", "timed_out"},
		{"startup_failure", "failure"}, {"", "neutral"}, {"some_future_value", "action_required"},
	} {
		if got := github.CheckRunConclusion(tc.workflow); got != tc.check {
			t.Errorf("CheckRunConclusion(%q) = %q, want %q", tc.workflow, got, tc.check)
		}
		cr, err := c.CreateCheckRun(ctx, 77, "acme/widgets", "release "+tc.workflow, testSHA, "1")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.CompleteCheckRun(ctx, 77, "acme/widgets", cr.ID, github.CheckRunConclusion(tc.workflow)); err != nil {
			t.Errorf("workflow conclusion %q: %v", tc.workflow, err)
			continue
		}
		for _, stored := range gh.CheckRuns() {
			if stored.ID == cr.ID && (stored.Conclusion != tc.check || stored.Status != "completed") {
				t.Errorf("workflow conclusion %q: check run %s/%s, want completed/%s", tc.workflow, stored.Status, stored.Conclusion, tc.check)
			}
		}
	}

	// "stale" itself is refused before anything is sent.
	cr, err := c.CreateCheckRun(ctx, 77, "acme/widgets", "release direct", testSHA, "2")
	if err != nil {
		t.Fatal(err)
	}
	before := len(callsTo(gh, fakegh.RouteUpdateCheckRun))
	err = c.CompleteCheckRun(ctx, 77, "acme/widgets", cr.ID, "stale")
	if outcome(err) != pgoutbox.OutcomePermanent || !strings.Contains(err.Error(), `"stale" is not a conclusion a Check Run may be given`) {
		t.Fatalf("stale: %v, want a permanent refusal", err)
	}
	if after := len(callsTo(gh, fakegh.RouteUpdateCheckRun)); after != before {
		t.Fatalf("a refused conclusion was sent (%d update calls, want %d)", after, before)
	}
}

// TestListCheckRunsFollowsPagination lists 250 check runs of one name: three
// pages of at most 100, every run once.
func TestListCheckRunsFollowsPagination(t *testing.T) {
	t.Parallel()
	gh, c := emulatorClient(t)
	ctx := t.Context()
	want := map[int64]bool{}
	for i := range 250 {
		cr, err := c.CreateCheckRun(ctx, 77, "acme/widgets", "release", testSHA, strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		want[cr.ID] = true
	}
	runs, err := c.ListCheckRuns(ctx, 77, "acme/widgets", testSHA, "release")
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]bool{}
	for _, r := range runs {
		if !want[r.ID] || got[r.ID] {
			t.Fatalf("check run %d unexpected or repeated", r.ID)
		}
		got[r.ID] = true
	}
	if len(got) != 250 {
		t.Fatalf("listed %d check runs, want 250", len(got))
	}
	calls := callsTo(gh, fakegh.RouteListCheckRunsForRef)
	if len(calls) != 3 {
		t.Fatalf("%d list requests, want 3 pages of 100", len(calls))
	}
}

// dispatch dispatches n release runs.
func dispatch(t *testing.T, c *github.Client, n int) {
	t.Helper()
	for i := range n {
		if _, err := c.DispatchWorkflow(t.Context(), 77, "acme/widgets", "release.yml", "main",
			map[string]string{"release_run_id": "1", "execution_attempt_id": strconv.Itoa(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListWorkflowRunsFollowsPagination lists 230 runs over three pages.
func TestListWorkflowRunsFollowsPagination(t *testing.T) {
	t.Parallel()
	gh, c := emulatorClient(t)
	dispatch(t, c, 230)
	runs, err := c.ListWorkflowRuns(t.Context(), 77, "acme/widgets", "release.yml", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, r := range runs {
		seen[r.ID] = true
	}
	if len(runs) != 230 || len(seen) != 230 {
		t.Fatalf("listed %d runs (%d distinct), want 230", len(runs), len(seen))
	}
	if n := len(callsTo(gh, fakegh.RouteListWorkflowRuns)); n != 3 {
		t.Fatalf("%d list requests, want 3", n)
	}
}

// TestListWorkflowRunsRefusesATruncatedListing: GitHub lists at most 1,000
// runs of a filtered search, so 1,001 runs in the window is an error, not
// a silently short list.
func TestListWorkflowRunsRefusesATruncatedListing(t *testing.T) {
	t.Parallel()
	gh, c := emulatorClient(t)
	dispatch(t, c, github.SearchLimit+1)
	runs, err := c.ListWorkflowRuns(t.Context(), 77, "acme/widgets", "release.yml", time.Now().Add(-time.Hour))
	if outcome(err) != pgoutbox.OutcomePermanent || runs != nil ||
		!strings.Contains(err.Error(), "1000 runs listed of 1001 counted") {
		t.Fatalf("1,001 runs: %d runs, %v; want an error naming the counts", len(runs), err)
	}
	if n := len(callsTo(gh, fakegh.RouteListWorkflowRuns)); n != 10 {
		t.Fatalf("%d list requests, want 10 (GitHub's 1,000 at 100 a page)", n)
	}
}

// TestPaginationNeverLeavesTheAPI: a next link to another host is refused
// and that host receives nothing (the token would go with the request).
func TestPaginationNeverLeavesTheAPI(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(other.Close)
	var pages atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"token": "ghs_test", "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
			return
		}
		n := pages.Add(1)
		switch r.URL.Query().Get("page") {
		case "":
			w.Header().Set("Link", `<`+"http://"+r.Host+r.URL.Path+`?page=2>; rel="next", <http://`+r.Host+r.URL.Path+`?page=3>; rel="last"`)
		case "2":
			w.Header().Set("Link", `<`+other.URL+r.URL.Path+`?page=3>; rel="next"`)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"total_count": 3, "check_runs": []any{map[string]any{"id": n, "name": "x"}}})
	}))
	t.Cleanup(api.Close)
	key := testKey()
	ts, err := github.NewTokenSource(api.Client(), api.URL, "1", key, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := github.NewClient(api.Client(), api.URL, ts)
	_, err = c.ListCheckRuns(t.Context(), 1, "acme/widgets", testSHA, "x")
	if outcome(err) != pgoutbox.OutcomePermanent || !strings.Contains(err.Error(), "leaves the API") {
		t.Fatalf("foreign next link: %v", err)
	}
	if elsewhere.Load() != 0 || pages.Load() != 2 {
		t.Fatalf("%d requests elsewhere, %d pages; want 0 and 2", elsewhere.Load(), pages.Load())
	}
}

// TestPaginationReadsLinkHeaderVariants: RFC 8288 allows the links in
// several Link header lines, in any order, with rel unquoted or holding
// several relation types.
func TestPaginationReadsLinkHeaderVariants(t *testing.T) {
	t.Parallel()
	var pages atomic.Int64
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(map[string]any{"token": "ghs_test", "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
			return
		}
		n := pages.Add(1)
		base := "http://" + r.Host + r.URL.Path
		switch r.URL.Query().Get("page") {
		case "":
			w.Header().Add("link", `<`+base+`?page=3>; rel="last"`)
			w.Header().Add("link", `<`+base+`?page=2>; rel=next`)
		case "2":
			w.Header().Set("Link", `<`+base+`?page=1>; rel="prev first", <`+base+`?page=3>; title="x"; REL="Next"`)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"total_count": 3, "check_runs": []any{map[string]any{"id": n, "name": "x"}}})
	}))
	t.Cleanup(api.Close)
	ts, err := github.NewTokenSource(api.Client(), api.URL, "1", testKey(), nil)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := github.NewClient(api.Client(), api.URL, ts).ListCheckRuns(t.Context(), 1, "acme/widgets", testSHA, "x")
	if err != nil || len(runs) != 3 || pages.Load() != 3 {
		t.Fatalf("%d runs over %d pages, %v; want 3 over 3", len(runs), pages.Load(), err)
	}
}

// TestRateLimitWaits: GitHub's rate-limit answers are retried no earlier
// than the wait they ask for, Retry-After as seconds or as an HTTP-date
// (RFC 9110), measured from the answer's Date; other 403s stay permanent.
func TestRateLimitWaits(t *testing.T) {
	t.Parallel()
	const date = "Sun, 01 Mar 2026 12:00:00 GMT"
	serverNow := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		status int
		header map[string]string
		want   pgoutbox.Outcome
		after  time.Duration
	}{
		{"429 Retry-After date", 429, map[string]string{"Retry-After": "Sun, 01 Mar 2026 12:00:45 GMT"}, pgoutbox.OutcomeRetryAfter, 45 * time.Second},
		{"403 Retry-After date", 403, map[string]string{"Retry-After": "Sun, 01 Mar 2026 12:02:00 GMT"}, pgoutbox.OutcomeRetryAfter, 2 * time.Minute},
		{"429 Retry-After seconds", 429, map[string]string{"Retry-After": "30"}, pgoutbox.OutcomeRetryAfter, 30 * time.Second},
		{"403 reset", 403, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": strconv.FormatInt(serverNow.Add(90*time.Second).Unix(), 10)}, pgoutbox.OutcomeRetryAfter, 90 * time.Second},
		{"429 without a wait", 429, nil, pgoutbox.OutcomeRetryAfter, time.Minute},
		{"403 forbidden", 403, map[string]string{"Retry-After": "later"}, pgoutbox.OutcomePermanent, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/access_tokens") {
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"token":"ghs_x","expires_at":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`))
				return
			}
			w.Header().Set("Date", date)
			for k, v := range tc.header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(`{"message":"slow down"}`))
		}))
		ts, err := github.NewTokenSource(srv.Client(), srv.URL, "12345", testKey(), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = github.NewClient(srv.Client(), srv.URL, ts).GetWorkflowRun(t.Context(), 7, "acme/widgets", 1)
		srv.Close()
		var oe *pgoutbox.OutcomeError
		if !errors.As(err, &oe) || oe.Outcome != tc.want || oe.After != tc.after || !strings.Contains(err.Error(), "slow down") {
			t.Errorf("%s: %v (%+v), want %s after %s", tc.name, err, oe, tc.want, tc.after)
		}
	}
}
