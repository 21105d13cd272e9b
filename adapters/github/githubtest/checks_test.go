package githubtest_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

type checkRunJSON struct {
	ID          int64   `json:"id"`
	Name        string  `json:"name"`
	HeadSHA     string  `json:"head_sha"`
	ExternalID  string  `json:"external_id"`
	Status      string  `json:"status"`
	Conclusion  *string `json:"conclusion"`
	StartedAt   *string `json:"started_at"`
	CompletedAt *string `json:"completed_at"`
	DetailsURL  string  `json:"details_url"`
	URL         string  `json:"url"`
	Output      struct {
		Title   *string `json:"title"`
		Summary *string `json:"summary"`
	} `json:"output"`
	App struct {
		ID int64 `json:"id"`
	} `json:"app"`
}

type checkRunList struct {
	TotalCount int            `json:"total_count"`
	CheckRuns  []checkRunJSON `json:"check_runs"`
}

func TestCheckRunCreateListUpdate(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	must(t, b.srv.SetRef(repoName, "refs/tags/v1.0.0", sha))
	started := b.clock.Now().Add(-time.Minute).Format(time.RFC3339)

	resp := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{
		"name": "BoardReadyOps release", "head_sha": sha, "external_id": "42",
		"status": "in_progress", "started_at": started,
		"output": map[string]any{"title": "Release", "summary": "dispatching"},
	})
	if resp.status != http.StatusCreated {
		t.Fatalf("create: HTTP %d %s", resp.status, resp.body)
	}
	var created checkRunJSON
	resp.decode(t, &created)
	if created.ID == 0 || created.Name != "BoardReadyOps release" || created.HeadSHA != sha || created.ExternalID != "42" ||
		created.Status != "in_progress" || created.Conclusion != nil || created.StartedAt == nil || *created.StartedAt != started ||
		created.CompletedAt != nil || created.Output.Summary == nil || *created.Output.Summary != "dispatching" ||
		created.App.ID != 1 || !strings.HasPrefix(created.URL, b.srv.URL()+"/repos/acme/widgets/check-runs/") {
		t.Fatalf("created = %+v", created)
	}

	// A second run with the same name (a re-run) and another name.
	for _, name := range []string{"BoardReadyOps release", "lint"} {
		if r := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": name, "head_sha": sha}); r.status != http.StatusCreated {
			t.Fatalf("create %s: HTTP %d %s", name, r.status, r.body)
		}
	}

	list := func(query string) checkRunList {
		t.Helper()
		r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/v1.0.0/check-runs"+query, b.token, nil)
		if r.status != http.StatusOK {
			t.Fatalf("list %s: HTTP %d %s", query, r.status, r.body)
		}
		var l checkRunList
		r.decode(t, &l)
		if l.TotalCount != len(l.CheckRuns) {
			t.Fatalf("total_count %d for %d runs", l.TotalCount, len(l.CheckRuns))
		}
		return l
	}
	if l := list("?check_name=BoardReadyOps+release&filter=all"); len(l.CheckRuns) != 2 {
		t.Errorf("filter=all: %d runs, want 2", len(l.CheckRuns))
	}
	if l := list("?check_name=BoardReadyOps+release"); len(l.CheckRuns) != 1 || l.CheckRuns[0].ID <= created.ID {
		t.Errorf("filter=latest: %+v, want only the newest", l.CheckRuns)
	}
	if l := list(""); len(l.CheckRuns) != 2 {
		t.Errorf("latest of every name: %d runs, want 2", len(l.CheckRuns))
	}
	if l := list("?status=in_progress&filter=all"); len(l.CheckRuns) != 1 || l.CheckRuns[0].ID != created.ID {
		t.Errorf("status=in_progress: %+v", l.CheckRuns)
	}
	// By SHA, partial ref and escaped full ref as well as by tag name.
	for _, ref := range []string{sha, "tags/v1.0.0", "refs%2Ftags%2Fv1.0.0"} {
		if r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/"+ref+"/check-runs?filter=all", b.token, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), `"total_count":3`) {
			t.Errorf("list by %s: HTTP %d %s", ref, r.status, r.body)
		}
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/"+sha+"/statuses", b.token, nil); r.status != http.StatusNotFound {
		t.Errorf("unknown commits sub-resource: HTTP %d", r.status)
	}

	// Complete it.
	path := "/repos/acme/widgets/check-runs/" + strconv.FormatInt(created.ID, 10)
	resp = b.do(t, http.MethodPatch, path, b.token, map[string]any{"conclusion": "success", "output": map[string]any{"title": "Done", "summary": "released"}})
	if resp.status != http.StatusOK {
		t.Fatalf("update: HTTP %d %s", resp.status, resp.body)
	}
	var updated checkRunJSON
	resp.decode(t, &updated)
	if updated.Status != "completed" || updated.Conclusion == nil || *updated.Conclusion != "success" ||
		updated.CompletedAt == nil || *updated.CompletedAt != b.clock.Now().Format(time.RFC3339) ||
		*updated.Output.Title != "Done" || updated.ExternalID != "42" {
		t.Fatalf("updated = %+v", updated)
	}
	if r := b.do(t, http.MethodGet, path, b.token, nil); r.status != http.StatusOK || !strings.Contains(string(r.body), `"conclusion":"success"`) {
		t.Fatalf("get: HTTP %d %s", r.status, r.body)
	}
	runs := b.srv.CheckRuns()
	if len(runs) != 3 || runs[0].ID != created.ID || runs[0].Conclusion != "success" || runs[0].Updates != 1 || runs[0].ExternalID != "42" {
		t.Fatalf("inspection: %+v", runs)
	}
}

func TestCheckRunValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	resp := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha})
	var created checkRunJSON
	resp.decode(t, &created)
	patchPath := "/repos/acme/widgets/check-runs/" + strconv.FormatInt(created.ID, 10)

	tests := []struct {
		name    string
		method  string
		path    string
		body    any
		status  int
		message string
	}{
		{"name missing", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"head_sha": sha}, 422, "Invalid request.\n\n\"name\" wasn't supplied."},
		{"head_sha missing", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"name": "x"}, 422, "Invalid request.\n\n\"head_sha\" wasn't supplied."},
		{"unknown commit", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"name": "x", "head_sha": "nope"}, 422, "No commit found for SHA: nope"},
		{"bad status", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"name": "x", "head_sha": sha, "status": "done"}, 422, ""},
		{"completed without conclusion", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"name": "x", "head_sha": sha, "status": "completed"}, 422, "Invalid request.\n\n\"conclusion\" wasn't supplied."},
		{"bad conclusion", http.MethodPatch, patchPath, map[string]any{"conclusion": "great"}, 422, ""},
		// "You cannot change a check run conclusion to stale, only GitHub can
		// set this" (Update a check run; Create a check run says the same).
		{"stale conclusion on update", http.MethodPatch, patchPath, map[string]any{"status": "completed", "conclusion": "stale"}, 422,
			"Invalid request.\n\nFor 'properties/conclusion', \"stale\" is not a valid value."},
		{"stale conclusion on create", http.MethodPost, "/repos/acme/widgets/check-runs", map[string]any{"name": "x", "head_sha": sha, "conclusion": "stale"}, 422, ""},
		{"malformed JSON", http.MethodPost, "/repos/acme/widgets/check-runs", "not an object", 400, "Problems parsing JSON"},
		{"unknown check run", http.MethodPatch, "/repos/acme/widgets/check-runs/12345", map[string]any{"status": "in_progress"}, 404, "Not Found"},
		{"check run of another repository", http.MethodPatch, "/repos/rival/gadgets/check-runs/" + strconv.FormatInt(created.ID, 10), map[string]any{"status": "in_progress"}, 404, "Not Found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := b.do(t, tt.method, tt.path, b.token, tt.body)
			if r.status != tt.status {
				t.Fatalf("HTTP %d %s, want %d", r.status, r.body, tt.status)
			}
			if tt.message != "" && r.message(t) != tt.message {
				t.Fatalf("message %q, want %q", r.message(t), tt.message)
			}
		})
	}
	if n := len(b.srv.CheckRuns()); n != 1 {
		t.Fatalf("%d check runs after rejected requests, want 1", n)
	}
	if runs := b.srv.CheckRuns(); runs[0].Updates != 0 || runs[0].Status != "queued" {
		t.Fatalf("a rejected PATCH changed the run: %+v", runs[0])
	}
}
