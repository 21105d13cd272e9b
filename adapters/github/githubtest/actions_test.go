package githubtest_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

type runJSON struct {
	ID           int64   `json:"id"`
	Name         string  `json:"name"`
	DisplayTitle string  `json:"display_title"`
	HeadBranch   string  `json:"head_branch"`
	HeadSHA      string  `json:"head_sha"`
	Event        string  `json:"event"`
	Status       string  `json:"status"`
	Conclusion   *string `json:"conclusion"`
	CreatedAt    string  `json:"created_at"`
	RunAttempt   int64   `json:"run_attempt"`
	RunNumber    int64   `json:"run_number"`
	Path         string  `json:"path"`
	WorkflowID   int64   `json:"workflow_id"`
	Repository   struct {
		FullName string `json:"full_name"`
	} `json:"repository"`
}

type runList struct {
	TotalCount   int       `json:"total_count"`
	WorkflowRuns []runJSON `json:"workflow_runs"`
}

const dispatchPath = "/repos/acme/widgets/actions/workflows/release.yml/dispatches"

func releaseInputs(run, attempt int) map[string]any {
	return map[string]any{"release_run_id": strconv.Itoa(run), "execution_attempt_id": strconv.Itoa(attempt)}
}

func TestDispatchWithRunDetails(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	must(t, b.srv.SetRef(repoName, "refs/tags/v1.2.3", sha))

	resp := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{
		"ref": "v1.2.3", "inputs": releaseInputs(12, 3), "return_run_details": true,
	})
	if resp.status != http.StatusOK {
		t.Fatalf("HTTP %d %s", resp.status, resp.body)
	}
	var details struct {
		WorkflowRunID int64  `json:"workflow_run_id"`
		RunURL        string `json:"run_url"`
		HTMLURL       string `json:"html_url"`
	}
	resp.decode(t, &details)
	wantRunURL := fmt.Sprintf("%s/repos/acme/widgets/actions/runs/%d", b.srv.URL(), details.WorkflowRunID)
	if details.WorkflowRunID == 0 || details.RunURL != wantRunURL ||
		details.HTMLURL != fmt.Sprintf("https://github.com/acme/widgets/actions/runs/%d", details.WorkflowRunID) {
		t.Fatalf("details = %+v", details)
	}

	r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/runs/"+strconv.FormatInt(details.WorkflowRunID, 10), b.token, nil)
	if r.status != http.StatusOK {
		t.Fatalf("get run: HTTP %d %s", r.status, r.body)
	}
	var run runJSON
	r.decode(t, &run)
	want := runJSON{
		ID: details.WorkflowRunID, Name: "Release", DisplayTitle: "release 12 attempt 3", HeadBranch: "v1.2.3",
		HeadSHA: sha, Event: "workflow_dispatch", Status: "queued", CreatedAt: b.clock.Now().Format(time.RFC3339),
		RunAttempt: 1, RunNumber: 1, Path: ".github/workflows/release.yml", WorkflowID: run.WorkflowID,
	}
	want.Repository.FullName = repoName
	if run != want || run.WorkflowID == 0 {
		t.Fatalf("run = %+v\nwant %+v", run, want)
	}

	dispatches := b.srv.Dispatches()
	if len(dispatches) != 1 {
		t.Fatalf("%d dispatches", len(dispatches))
	}
	d := dispatches[0]
	if d.Ref != "v1.2.3" || d.Inputs["release_run_id"] != "12" || d.Inputs["execution_attempt_id"] != "3" ||
		!d.ReturnRunDetails || d.RunID != details.WorkflowRunID || d.Repository != repoName {
		t.Fatalf("dispatch = %+v", d)
	}
}

func TestDispatchWithoutRunDetails(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	resp := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "refs/tags/v2.0.0", "inputs": releaseInputs(7, 1)})
	if resp.status != http.StatusNoContent || len(resp.body) != 0 {
		t.Fatalf("HTTP %d %q, want 204 without a body", resp.status, resp.body)
	}
	runs := b.srv.WorkflowRuns()
	if len(runs) != 1 || runs[0].DisplayTitle != "release 7 attempt 1" || runs[0].HeadBranch != "v2.0.0" || len(runs[0].HeadSHA) != 40 {
		t.Fatalf("runs = %+v", runs)
	}
	// The numeric workflow id works as well as the file name.
	byID := fmt.Sprintf("/repos/acme/widgets/actions/workflows/%d/dispatches", runs[0].WorkflowID)
	if r := b.do(t, http.MethodPost, byID, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(7, 2)}); r.status != http.StatusNoContent {
		t.Fatalf("dispatch by id: HTTP %d %s", r.status, r.body)
	}
}

func TestDispatchValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{RequireKnownRefs: true})
	tooMany := map[string]any{}
	for i := range 26 {
		tooMany[fmt.Sprintf("in%d", i)] = "x"
	}
	tests := []struct {
		name    string
		path    string
		body    any
		status  int
		message string
	}{
		{"ref missing", dispatchPath, map[string]any{"inputs": releaseInputs(1, 1)}, 422, "Invalid request.\n\n\"ref\" wasn't supplied."},
		{"unknown workflow", "/repos/acme/widgets/actions/workflows/deploy.yml/dispatches", map[string]any{"ref": "main"}, 404, "Not Found"},
		{"too many inputs", dispatchPath, map[string]any{"ref": "main", "inputs": tooMany}, 422, "you may only define up to 25 `inputs` for a `workflow_dispatch` event"},
		{"unexpected input", dispatchPath, map[string]any{"ref": "main", "inputs": map[string]any{"release_run_id": "1", "execution_attempt_id": "1", "debug": true}}, 422, `Unexpected inputs provided: ["debug"]`},
		{"required input missing", dispatchPath, map[string]any{"ref": "main", "inputs": map[string]any{"release_run_id": "1"}}, 422, "Required input 'execution_attempt_id' not provided"},
		{"object input", dispatchPath, map[string]any{"ref": "main", "inputs": map[string]any{"release_run_id": map[string]any{}, "execution_attempt_id": "1"}}, 422, ""},
		{"unknown ref", dispatchPath, map[string]any{"ref": "v9.9.9", "inputs": releaseInputs(1, 1)}, 422, "No ref found for: v9.9.9"},
		{"malformed JSON", dispatchPath, []int{1}, 400, "Problems parsing JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.do(t, http.MethodPost, tt.path, b.token, tt.body)
			if r.status != tt.status {
				t.Fatalf("HTTP %d %s, want %d", r.status, r.body, tt.status)
			}
			if tt.message != "" && r.message(t) != tt.message {
				t.Fatalf("message %q, want %q", r.message(t), tt.message)
			}
		})
	}
	if n := len(b.srv.Dispatches()); n != 0 {
		t.Fatalf("%d dispatches after rejected requests", n)
	}
	// Numbers and booleans are accepted as input values.
	if r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": map[string]any{"release_run_id": 5, "execution_attempt_id": 2}}); r.status != http.StatusNoContent {
		t.Fatalf("numeric inputs: HTTP %d %s", r.status, r.body)
	}
	if runs := b.srv.WorkflowRuns(); len(runs) != 1 || runs[0].DisplayTitle != "release 5 attempt 2" {
		t.Fatalf("runs = %+v", runs)
	}
}

func TestCustomWorkflowRunName(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	id, err := b.srv.AddWorkflow(repoName, fakegh.Workflow{
		Name: "Deploy", Path: ".github/workflows/deploy.yml",
		RunName: "deploy ${{ github.ref_name }} by ${{ github.actor }} (${{ inputs.env }})",
		Inputs:  []fakegh.WorkflowInput{{Name: "env", Default: "staging"}},
	})
	must(t, err)
	if r := b.do(t, http.MethodPost, "/repos/acme/widgets/actions/workflows/deploy.yml/dispatches", b.token, map[string]any{"ref": "main"}); r.status != http.StatusNoContent {
		t.Fatalf("HTTP %d %s", r.status, r.body)
	}
	runs := b.srv.WorkflowRuns()
	if len(runs) != 1 || runs[0].WorkflowID != id || runs[0].DisplayTitle != "deploy main by pgoutbox-emulated[bot] (staging)" || runs[0].Inputs["env"] != "staging" {
		t.Fatalf("runs = %+v", runs)
	}
	if _, err := b.srv.AddWorkflow(repoName, fakegh.Workflow{Path: ".github/workflows/deploy.yml"}); err == nil {
		t.Fatal("a duplicate workflow path was accepted")
	}
}

func TestListWorkflowRunsFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	start := b.clock.Now()
	var ids []int64
	for i := range 5 {
		r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, i+1), "return_run_details": true})
		var d struct {
			ID int64 `json:"workflow_run_id"`
		}
		r.decode(t, &d)
		ids = append(ids, d.ID)
		b.clock.Advance(time.Minute)
	}
	_, err := b.srv.CompleteRun(t.Context(), ids[0], "failure")
	must(t, err)

	list := func(query url.Values) (runList, http.Header) {
		t.Helper()
		r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/workflows/release.yml/runs?"+query.Encode(), b.token, nil)
		if r.status != http.StatusOK {
			t.Fatalf("list %s: HTTP %d %s", query.Encode(), r.status, r.body)
		}
		var l runList
		r.decode(t, &l)
		return l, r.header
	}
	l, _ := list(url.Values{"created": {">=" + start.Add(2*time.Minute).Format(time.RFC3339)}, "event": {"workflow_dispatch"}})
	if l.TotalCount != 3 || len(l.WorkflowRuns) != 3 || l.WorkflowRuns[0].ID != ids[4] || l.WorkflowRuns[2].ID != ids[2] {
		t.Fatalf("created>=: %+v", l)
	}
	if l.WorkflowRuns[0].DisplayTitle != "release 1 attempt 5" {
		t.Errorf("display_title = %q", l.WorkflowRuns[0].DisplayTitle)
	}
	if l, _ := list(url.Values{"status": {"failure"}}); l.TotalCount != 1 || l.WorkflowRuns[0].ID != ids[0] {
		t.Errorf("status=failure: %+v", l)
	}
	if l, _ := list(url.Values{"status": {"queued"}}); l.TotalCount != 4 {
		t.Errorf("status=queued: %d runs", l.TotalCount)
	}
	if l, _ := list(url.Values{"event": {"push"}}); l.TotalCount != 0 || l.WorkflowRuns == nil {
		t.Errorf("event=push: %+v (want an empty, non-null list)", l)
	}
	if l, _ := list(url.Values{"created": {start.Format(time.DateOnly)}}); l.TotalCount != 5 {
		t.Errorf("created=<day>: %d runs", l.TotalCount)
	}
	l, h := list(url.Values{"per_page": {"2"}, "page": {"2"}})
	if l.TotalCount != 5 || len(l.WorkflowRuns) != 2 || l.WorkflowRuns[0].ID != ids[2] {
		t.Errorf("page 2: %+v", l)
	}
	if link := h.Get("Link"); !strings.Contains(link, `page=3&per_page=2>; rel="next"`) || !strings.Contains(link, `rel="prev"`) {
		t.Errorf("Link = %q", link)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/runs?per_page=100", b.token, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), `"total_count":5`) {
		t.Errorf("repository runs: HTTP %d %s", r.status, r.body)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/workflows/release.yml/runs?created=yesterday", b.token, nil); r.status != http.StatusUnprocessableEntity {
		t.Errorf("invalid created: HTTP %d", r.status)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/runs/1", b.token, nil); r.status != http.StatusNotFound {
		t.Errorf("unknown run: HTTP %d", r.status)
	}
}

// TestIDsAreNeverHandedOutTwice: GitHub's ids are unique forever, so a
// second emulator (a second demo against the same database) must not give a
// workflow run or check run an id the first one gave.
func TestIDsAreNeverHandedOutTwice(t *testing.T) {
	runIDs := map[int64]bool{}
	for i := range 2 {
		b := setup(t, fakegh.Options{})
		must(t, b.srv.SetRef(repoName, "refs/tags/v1.2.3", sha))
		resp := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{
			"ref": "v1.2.3", "inputs": releaseInputs(12, 3), "return_run_details": true,
		})
		if resp.status != http.StatusOK {
			t.Fatalf("emulator %d: HTTP %d %s", i, resp.status, resp.body)
		}
		var details struct {
			WorkflowRunID int64 `json:"workflow_run_id"`
		}
		resp.decode(t, &details)
		if runIDs[details.WorkflowRunID] {
			t.Fatalf("emulator %d handed out workflow run id %d again", i, details.WorkflowRunID)
		}
		runIDs[details.WorkflowRunID] = true
		cr := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "release", "head_sha": sha})
		if cr.status != http.StatusCreated {
			t.Fatalf("emulator %d: check run: HTTP %d %s", i, cr.status, cr.body)
		}
		var run struct {
			ID int64 `json:"id"`
		}
		cr.decode(t, &run)
		if runIDs[run.ID] {
			t.Fatalf("emulator %d handed out check run id %d again (or as a workflow run's)", i, run.ID)
		}
		runIDs[run.ID] = true
	}
}
