package githubtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ReleaseRunName is the run-name of the documented release workflow.
const ReleaseRunName = "release ${{ inputs.release_run_id }} attempt ${{ inputs.execution_attempt_id }}"

// Workflow is a workflow file of a repository.
type Workflow struct {
	// ID is the workflow id; AddWorkflow assigns one when zero.
	ID int64
	// Name is the workflow's name (its "name:" key).
	Name string
	// Path is the file, e.g. ".github/workflows/release.yml"; the file name
	// is accepted as {workflow_id}.
	Path string
	// RunName is the "run-name:" template; ${{ inputs.X }}, ${{ github.ref }},
	// ${{ github.ref_name }}, ${{ github.sha }}, ${{ github.event_name }} and
	// ${{ github.actor }} are rendered. Empty: runs are titled Name.
	RunName string
	// Inputs are the declared workflow_dispatch inputs; nil accepts any
	// inputs, as a file without an "inputs:" map would not.
	Inputs []WorkflowInput
}

// WorkflowInput is a declared workflow_dispatch input.
type WorkflowInput struct {
	// Name is the input's name.
	Name string
	// Required inputs must be sent unless they have a Default.
	Required bool
	// Default is used when the input is not sent.
	Default string
}

// ReleaseWorkflow returns the documented release workflow: "Release" in
// .github/workflows/release.yml with run-name ReleaseRunName and the
// required inputs release_run_id and execution_attempt_id.
func ReleaseWorkflow() Workflow {
	return Workflow{
		Name:    "Release",
		Path:    ".github/workflows/release.yml",
		RunName: ReleaseRunName,
		Inputs: []WorkflowInput{
			{Name: "release_run_id", Required: true},
			{Name: "execution_attempt_id", Required: true},
		},
	}
}

// Dispatch is one accepted workflow dispatch.
type Dispatch struct {
	// Seq numbers dispatches from 1.
	Seq int64
	// Repository is the repository's full name.
	Repository string
	// WorkflowID is the dispatched workflow's id.
	WorkflowID int64
	// WorkflowPath is the dispatched workflow's file.
	WorkflowPath string
	// Ref is the ref as sent.
	Ref string
	// Inputs are the inputs as sent (values rendered as strings), defaults
	// not applied.
	Inputs map[string]string
	// ReturnRunDetails is the request's return_run_details.
	ReturnRunDetails bool
	// RunID is the workflow run the dispatch created.
	RunID int64
	// At is when the dispatch was accepted.
	At time.Time
}

// WorkflowRun is a workflow run as the emulator stores it.
type WorkflowRun struct {
	// ID is the run id.
	ID int64
	// Repository is the repository's full name.
	Repository string
	// RepositoryID is the repository's id.
	RepositoryID int64
	// InstallationID owns the repository.
	InstallationID int64
	// WorkflowID is the workflow's id.
	WorkflowID int64
	// Name is the workflow's name; Path its file.
	Name, Path string
	// DisplayTitle is the rendered run-name.
	DisplayTitle string
	// HeadBranch is the short ref (the tag name for a tag); HeadSHA the
	// commit.
	HeadBranch, HeadSHA string
	// Event is "workflow_dispatch".
	Event string
	// Status is queued, in_progress or completed; Conclusion is "" until
	// completed.
	Status, Conclusion string
	// RunNumber counts the workflow's runs; RunAttempt is 1.
	RunNumber, RunAttempt int64
	// Inputs are the inputs after defaults were applied.
	Inputs map[string]string
	// CreatedAt, UpdatedAt and RunStartedAt are the run's timestamps.
	CreatedAt, UpdatedAt, RunStartedAt time.Time
}

// AddWorkflow registers w in repoFullName and returns its id.
func (s *Server) AddWorkflow(repoFullName string, w Workflow) (int64, error) {
	if w.Path == "" || !strings.HasPrefix(w.Path, ".github/workflows/") {
		return 0, fmt.Errorf("githubtest: workflow path %q is not under .github/workflows/", w.Path)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.repos[strings.ToLower(repoFullName)]
	if !ok {
		return 0, fmt.Errorf("githubtest: unknown repository %s", repoFullName)
	}
	for _, existing := range r.workflows {
		if existing.Path == w.Path || (w.ID != 0 && existing.ID == w.ID) {
			return 0, fmt.Errorf("githubtest: workflow %s already exists in %s", w.Path, repoFullName)
		}
	}
	id := s.addWorkflowLocked(r, w)
	s.notify()
	return id, nil
}

func (s *Server) addWorkflowLocked(r *repository, w Workflow) int64 {
	if w.ID == 0 {
		w.ID = s.id("workflow")
	}
	if w.Name == "" {
		w.Name = w.Path
	}
	w.Inputs = slices.Clone(w.Inputs)
	r.workflows = append(r.workflows, &w)
	return w.ID
}

// workflowFor finds {workflow_id} (an id or a file name) in repo.
func workflowFor(repo *repository, key string) *Workflow {
	id, err := strconv.ParseInt(key, 10, 64)
	for _, w := range repo.workflows {
		if (err == nil && w.ID == id) || path.Base(w.Path) == key {
			return w
		}
	}
	return nil
}

func (s *Server) getWorkflow(r *http.Request, p principal) reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "actions", "read")
	if rep != nil {
		return *rep
	}
	w := workflowFor(repo, r.PathValue("workflow_id"))
	if w == nil {
		return notFound()
	}
	return jsonReply(http.StatusOK, s.workflowJSON(repo, w, apiBase(r)))
}

// dispatchBody is the body of the dispatch route.
type dispatchBody struct {
	Ref              *string                    `json:"ref"`
	Inputs           map[string]json.RawMessage `json:"inputs"`
	ReturnRunDetails bool                       `json:"return_run_details"`
}

func (s *Server) dispatchWorkflow(r *http.Request, p principal) reply {
	const doc = docDispatch
	var body dispatchBody
	if !decodeBody(r, &body, false) {
		return badJSON(doc)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "actions", "write")
	if rep != nil {
		return *rep
	}
	w := workflowFor(repo, r.PathValue("workflow_id"))
	if w == nil {
		return notFound()
	}
	if body.Ref == nil || *body.Ref == "" {
		return missingField("ref", doc)
	}
	if len(body.Inputs) > MaxWorkflowInputs {
		return errorReply(http.StatusUnprocessableEntity, fmt.Sprintf("you may only define up to %d `inputs` for a `workflow_dispatch` event", MaxWorkflowInputs), doc)
	}
	sent := make(map[string]string, len(body.Inputs))
	for name, raw := range body.Inputs {
		v, ok := inputValue(raw)
		if !ok {
			return invalidField("inputs/"+name, json.RawMessage(raw), doc)
		}
		sent[name] = v
	}
	inputs, rep := applyInputs(w, sent, doc)
	if rep != nil {
		return *rep
	}
	sha, ref, ok := s.resolveRef(repo, *body.Ref)
	if !ok {
		return errorReply(http.StatusUnprocessableEntity, "No ref found for: "+*body.Ref, doc)
	}
	now := s.now().UTC().Truncate(time.Second)
	repo.runNumbers[w.ID]++
	run := &WorkflowRun{
		ID: s.id("run"), Repository: repo.fullName(), RepositoryID: repo.id, InstallationID: repo.installationID,
		WorkflowID: w.ID, Name: w.Name, Path: w.Path, HeadBranch: shortRef(ref), HeadSHA: sha,
		Event: "workflow_dispatch", Status: "queued", RunNumber: repo.runNumbers[w.ID], RunAttempt: 1,
		Inputs: inputs, CreatedAt: now, UpdatedAt: now, RunStartedAt: now,
	}
	run.DisplayTitle = renderRunName(w, run, ref, s.opts.AppSlug+"[bot]")
	s.runs = append(s.runs, run)
	s.dispatches = append(s.dispatches, Dispatch{
		Seq: s.id("dispatch"), Repository: repo.fullName(), WorkflowID: w.ID, WorkflowPath: w.Path,
		Ref: *body.Ref, Inputs: sent, ReturnRunDetails: body.ReturnRunDetails, RunID: run.ID, At: now,
	})
	s.notify()
	if !body.ReturnRunDetails {
		return reply{status: http.StatusNoContent}
	}
	return jsonReply(http.StatusOK, map[string]any{
		"workflow_run_id": run.ID,
		"run_url":         apiBase(r) + "/repos/" + run.Repository + "/actions/runs/" + itoa(run.ID),
		"html_url":        s.opts.HTMLURL + "/" + run.Repository + "/actions/runs/" + itoa(run.ID),
	})
}

// inputValue renders a JSON string, number or boolean input as a string.
func inputValue(raw json.RawMessage) (string, bool) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case float64:
		return strings.TrimSpace(string(raw)), true
	case bool:
		return strconv.FormatBool(v), true
	default:
		return "", false
	}
}

// applyInputs checks sent against w's declared inputs and applies defaults.
func applyInputs(w *Workflow, sent map[string]string, doc string) (map[string]string, *reply) {
	fail := func(rep reply) (map[string]string, *reply) { return nil, &rep }
	out := make(map[string]string, len(sent))
	for k, v := range sent {
		out[k] = v
	}
	if w.Inputs == nil {
		return out, nil
	}
	var unexpected []string
	for name := range sent {
		if !slices.ContainsFunc(w.Inputs, func(in WorkflowInput) bool { return in.Name == name }) {
			unexpected = append(unexpected, name)
		}
	}
	if len(unexpected) > 0 {
		slices.Sort(unexpected)
		list, _ := json.Marshal(unexpected)
		return fail(errorReply(http.StatusUnprocessableEntity, "Unexpected inputs provided: "+string(list), doc))
	}
	for _, in := range w.Inputs {
		if _, ok := out[in.Name]; ok {
			continue
		}
		if in.Default != "" {
			out[in.Name] = in.Default
			continue
		}
		if in.Required {
			return fail(errorReply(http.StatusUnprocessableEntity, fmt.Sprintf("Required input '%s' not provided", in.Name), doc))
		}
	}
	return out, nil
}

var expression = regexp.MustCompile(`\$\{\{\s*([^}]*?)\s*\}\}`)

// renderRunName renders w's run-name for run.
func renderRunName(w *Workflow, run *WorkflowRun, ref, actor string) string {
	if w.RunName == "" {
		return w.Name
	}
	return expression.ReplaceAllStringFunc(w.RunName, func(m string) string {
		expr := expression.FindStringSubmatch(m)[1]
		if name, ok := strings.CutPrefix(expr, "inputs."); ok {
			return run.Inputs[name]
		}
		if name, ok := strings.CutPrefix(expr, "github.event.inputs."); ok {
			return run.Inputs[name]
		}
		switch expr {
		case "github.ref":
			return ref
		case "github.ref_name":
			return shortRef(ref)
		case "github.sha":
			return run.HeadSHA
		case "github.event_name":
			return run.Event
		case "github.actor", "github.triggering_actor":
			return actor
		case "github.workflow":
			return w.Name
		default:
			return ""
		}
	})
}

var (
	runStatuses    = []string{"requested", "in_progress", "completed", "queued", "pending", "waiting"}
	runConclusions = []string{"action_required", "cancelled", "failure", "neutral", "skipped", "stale", "success", "timed_out", "startup_failure"}
)

func (s *Server) listWorkflowRuns(r *http.Request, p principal) reply {
	doc := docWorkflowRuns + "#list-workflow-runs-for-a-repository"
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "actions", "read")
	if rep != nil {
		return *rep
	}
	var w *Workflow
	if key := r.PathValue("workflow_id"); key != "" {
		doc = docWorkflowRuns + "#list-workflow-runs-for-a-workflow"
		if w = workflowFor(repo, key); w == nil {
			return notFound()
		}
	}
	q := r.URL.Query()
	created, err := parseDateRange(q.Get("created"))
	if err != nil {
		return errorReply(http.StatusUnprocessableEntity, "Validation Failed", doc,
			fieldError{Resource: "WorkflowRun", Code: "invalid", Field: "created"})
	}
	status := q.Get("status")
	var matched []*WorkflowRun
	for _, run := range s.runs {
		if run.RepositoryID != repo.id || (w != nil && run.WorkflowID != w.ID) ||
			!created.contains(run.CreatedAt) ||
			(q.Get("event") != "" && run.Event != q.Get("event")) ||
			(q.Get("branch") != "" && run.HeadBranch != q.Get("branch")) ||
			(q.Get("head_sha") != "" && run.HeadSHA != q.Get("head_sha")) ||
			(q.Get("actor") != "" && q.Get("actor") != s.opts.AppSlug+"[bot]") {
			continue
		}
		if status != "" {
			switch {
			case slices.Contains(runStatuses, status) && run.Status != status,
				slices.Contains(runConclusions, status) && run.Conclusion != status,
				!slices.Contains(runStatuses, status) && !slices.Contains(runConclusions, status):
				continue
			}
		}
		matched = append(matched, run)
	}
	slices.SortFunc(matched, func(a, b *WorkflowRun) int { return cmpDesc(a.ID, b.ID) })
	total := len(matched)
	// "This endpoint will return up to 1,000 results for each search when
	// using the following parameters: actor, branch, check_suite_id,
	// created, event, head_sha, status." total_count still counts them all.
	for _, f := range []string{"actor", "branch", "check_suite_id", "created", "event", "head_sha", "status"} {
		if q.Get(f) != "" && len(matched) > SearchLimit {
			matched = matched[:SearchLimit]
			break
		}
	}
	page, perPage := pagination(q)
	items := []any{}
	for _, run := range paginate(matched, page, perPage) {
		items = append(items, s.runJSON(run, apiBase(r)))
	}
	out := jsonReply(http.StatusOK, map[string]any{"total_count": total, "workflow_runs": items})
	out.header = linkHeader(r, page, perPage, len(matched))
	return out
}

func (s *Server) getWorkflowRun(r *http.Request, p principal) reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "actions", "read")
	if rep != nil {
		return *rep
	}
	id, err := strconv.ParseInt(r.PathValue("run_id"), 10, 64)
	if err == nil {
		for _, run := range s.runs {
			if run.ID == id && run.RepositoryID == repo.id {
				return jsonReply(http.StatusOK, s.runJSON(run, apiBase(r)))
			}
		}
	}
	return notFound()
}

// runJSON renders run as GitHub's workflow run object; s.mu must be held.
func (s *Server) runJSON(run *WorkflowRun, base string) map[string]any {
	repo := s.reposByID[run.RepositoryID]
	runURL := base + "/repos/" + run.Repository + "/actions/runs/" + itoa(run.ID)
	actor := map[string]any{"login": s.opts.AppSlug + "[bot]", "id": 41898282, "type": "Bot"}
	repoObj := s.repoJSON(repo, base)
	return map[string]any{
		"id":                   run.ID,
		"name":                 run.Name,
		"node_id":              nodeID("WFR", run.ID),
		"head_branch":          run.HeadBranch,
		"head_sha":             run.HeadSHA,
		"path":                 run.Path,
		"display_title":        run.DisplayTitle,
		"run_number":           run.RunNumber,
		"event":                run.Event,
		"status":               run.Status,
		"conclusion":           nullable(run.Conclusion),
		"workflow_id":          run.WorkflowID,
		"check_suite_id":       run.ID + 1_000_000_000,
		"url":                  runURL,
		"html_url":             s.opts.HTMLURL + "/" + run.Repository + "/actions/runs/" + itoa(run.ID),
		"pull_requests":        []any{},
		"created_at":           timestamp(run.CreatedAt),
		"updated_at":           timestamp(run.UpdatedAt),
		"actor":                actor,
		"triggering_actor":     actor,
		"run_attempt":          run.RunAttempt,
		"referenced_workflows": []any{},
		"run_started_at":       timestamp(run.RunStartedAt),
		"jobs_url":             runURL + "/jobs",
		"logs_url":             runURL + "/logs",
		"check_suite_url":      base + "/repos/" + run.Repository + "/check-suites/" + itoa(run.ID+1_000_000_000),
		"artifacts_url":        runURL + "/artifacts",
		"cancel_url":           runURL + "/cancel",
		"rerun_url":            runURL + "/rerun",
		"previous_attempt_url": nil,
		"workflow_url":         base + "/repos/" + run.Repository + "/actions/workflows/" + itoa(run.WorkflowID),
		"head_commit": map[string]any{
			"id": run.HeadSHA, "tree_id": syntheticSHA(run.HeadSHA, "tree"), "message": "release",
			"timestamp": timestamp(run.CreatedAt),
		},
		"repository":      repoObj,
		"head_repository": repoObj,
	}
}

func (s *Server) workflowJSON(repo *repository, w *Workflow, base string) map[string]any {
	return map[string]any{
		"id":         w.ID,
		"node_id":    nodeID("W", w.ID),
		"name":       w.Name,
		"path":       w.Path,
		"state":      "active",
		"created_at": "2024-01-01T00:00:00Z",
		"updated_at": "2024-01-01T00:00:00Z",
		"url":        base + "/repos/" + repo.fullName() + "/actions/workflows/" + itoa(w.ID),
		"html_url":   s.opts.HTMLURL + "/" + repo.fullName() + "/blob/" + repo.defaultBranch + "/" + w.Path,
		"badge_url":  s.opts.HTMLURL + "/" + repo.fullName() + "/workflows/" + url.PathEscape(w.Name) + "/badge.svg",
	}
}
