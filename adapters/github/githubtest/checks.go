package githubtest

import (
	"encoding/base64"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Check run statuses and conclusions GitHub accepts on create and update
// ("Update a check run": "You cannot change a check run conclusion to stale,
// only GitHub can set this"; the emulator answers 422 for it as for any
// value outside the enumeration).
var (
	checkRunStatuses    = []string{"queued", "in_progress", "completed", "waiting", "requested", "pending"}
	checkRunConclusions = []string{"action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out"}
)

// CheckRun is a check run as the emulator stores it.
type CheckRun struct {
	// ID is the check run id.
	ID int64
	// Repository is the repository's full name.
	Repository string
	// RepositoryID is the repository's id.
	RepositoryID int64
	// Name, HeadSHA, ExternalID, DetailsURL, Status and Conclusion are the
	// check run's fields ("" for an absent conclusion).
	Name, HeadSHA, ExternalID, DetailsURL, Status, Conclusion string
	// StartedAt and CompletedAt are zero when unset.
	StartedAt, CompletedAt time.Time
	// Output is the check run's output.
	Output CheckRunOutput
	// CheckSuiteID is the suite of (repository, head SHA, app).
	CheckSuiteID int64
	// Updates counts the PATCH requests applied.
	Updates int
}

// CheckRunOutput is a check run's output.
type CheckRunOutput struct {
	// Title, Summary and Text are the output's fields.
	Title, Summary, Text string
}

// checkRunBody is the JSON body of the create and update routes; pointers
// tell an absent field from an empty one.
type checkRunBody struct {
	Name        *string `json:"name"`
	HeadSHA     *string `json:"head_sha"`
	DetailsURL  *string `json:"details_url"`
	ExternalID  *string `json:"external_id"`
	Status      *string `json:"status"`
	Conclusion  *string `json:"conclusion"`
	StartedAt   *string `json:"started_at"`
	CompletedAt *string `json:"completed_at"`
	Output      *struct {
		Title   *string `json:"title"`
		Summary *string `json:"summary"`
		Text    *string `json:"text"`
	} `json:"output"`
}

func (s *Server) createCheckRun(r *http.Request, p principal) reply {
	const doc = docCheckRuns + "#create-a-check-run"
	var body checkRunBody
	if !decodeBody(r, &body, false) {
		return badJSON(doc)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "checks", "write")
	if rep != nil {
		return *rep
	}
	if body.Name == nil || *body.Name == "" {
		return missingField("name", doc)
	}
	if body.HeadSHA == nil || *body.HeadSHA == "" {
		return missingField("head_sha", doc)
	}
	if !isSHA(*body.HeadSHA) {
		return errorReply(http.StatusUnprocessableEntity, "No commit found for SHA: "+*body.HeadSHA, doc)
	}
	cr := &CheckRun{
		Repository: repo.fullName(), RepositoryID: repo.id, Name: *body.Name,
		HeadSHA: strings.ToLower(*body.HeadSHA), Status: "queued",
	}
	if rep := s.applyCheckRunBody(cr, body, doc); rep != nil {
		return *rep
	}
	cr.ID = s.id("check_run")
	suiteKey := itoa(repo.id) + "/" + cr.HeadSHA
	if s.checkSuites[suiteKey] == 0 {
		s.checkSuites[suiteKey] = s.id("check_suite")
	}
	cr.CheckSuiteID = s.checkSuites[suiteKey]
	s.checkRuns = append(s.checkRuns, cr)
	s.notify()
	return jsonReply(http.StatusCreated, s.checkRunJSON(cr, apiBase(r)))
}

func (s *Server) updateCheckRun(r *http.Request, p principal) reply {
	const doc = docCheckRuns + "#update-a-check-run"
	var body checkRunBody
	if !decodeBody(r, &body, false) {
		return badJSON(doc)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cr, rep := s.checkRunFor(r, p)
	if rep != nil {
		return *rep
	}
	if rep := s.permit(p, "checks", "write"); rep != nil {
		return *rep
	}
	if body.Name != nil && *body.Name == "" {
		return invalidField("name", *body.Name, doc)
	}
	updated := *cr
	if body.Name != nil {
		updated.Name = *body.Name
	}
	if rep := s.applyCheckRunBody(&updated, body, doc); rep != nil {
		return *rep
	}
	updated.Updates++
	*cr = updated
	s.notify()
	return jsonReply(http.StatusOK, s.checkRunJSON(cr, apiBase(r)))
}

// applyCheckRunBody applies the optional fields shared by create and update:
// a conclusion completes the run; status "completed" needs a conclusion.
func (s *Server) applyCheckRunBody(cr *CheckRun, body checkRunBody, doc string) *reply {
	fail := func(rep reply) *reply { return &rep }
	if body.DetailsURL != nil {
		cr.DetailsURL = *body.DetailsURL
	}
	if body.ExternalID != nil {
		cr.ExternalID = *body.ExternalID
	}
	if body.Status != nil {
		if !slices.Contains(checkRunStatuses, *body.Status) {
			return fail(invalidField("status", *body.Status, doc))
		}
		cr.Status = *body.Status
	}
	if body.StartedAt != nil {
		t, err := time.Parse(time.RFC3339, *body.StartedAt)
		if err != nil {
			return fail(invalidField("started_at", *body.StartedAt, doc))
		}
		cr.StartedAt = t.UTC()
	}
	if body.CompletedAt != nil {
		t, err := time.Parse(time.RFC3339, *body.CompletedAt)
		if err != nil {
			return fail(invalidField("completed_at", *body.CompletedAt, doc))
		}
		cr.CompletedAt = t.UTC()
	}
	if body.Conclusion != nil {
		if !slices.Contains(checkRunConclusions, *body.Conclusion) {
			return fail(invalidField("conclusion", *body.Conclusion, doc))
		}
		cr.Conclusion = *body.Conclusion
		cr.Status = "completed"
	}
	if cr.Status == "completed" {
		if cr.Conclusion == "" {
			return fail(missingField("conclusion", doc))
		}
		if cr.CompletedAt.IsZero() {
			cr.CompletedAt = s.now().UTC().Truncate(time.Second)
		}
	} else if body.CompletedAt != nil {
		return fail(missingField("conclusion", doc))
	}
	if cr.Status != "queued" && cr.StartedAt.IsZero() {
		cr.StartedAt = s.now().UTC().Truncate(time.Second)
	}
	if o := body.Output; o != nil {
		if o.Summary == nil && (o.Title != nil || o.Text != nil) {
			return fail(missingField("summary", doc))
		}
		if o.Title != nil {
			cr.Output.Title = *o.Title
		}
		if o.Summary != nil {
			cr.Output.Summary = *o.Summary
		}
		if o.Text != nil {
			cr.Output.Text = *o.Text
		}
	}
	return nil
}

func (s *Server) getCheckRun(r *http.Request, p principal) reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	cr, rep := s.checkRunFor(r, p)
	if rep != nil {
		return *rep
	}
	if rep := s.permit(p, "checks", "read"); rep != nil {
		return *rep
	}
	return jsonReply(http.StatusOK, s.checkRunJSON(cr, apiBase(r)))
}

// checkRunFor finds {check_run_id} in the request's repository; s.mu must
// be held.
func (s *Server) checkRunFor(r *http.Request, p principal) (*CheckRun, *reply) {
	repo, rep := s.repoFor(r, p)
	if rep != nil {
		return nil, rep
	}
	id, err := strconv.ParseInt(r.PathValue("check_run_id"), 10, 64)
	if err == nil {
		for _, cr := range s.checkRuns {
			if cr.ID == id && cr.RepositoryID == repo.id {
				return cr, nil
			}
		}
	}
	nf := notFound()
	return nil, &nf
}

func (s *Server) listCheckRunsForRef(r *http.Request, p principal) reply {
	const doc = docCheckRuns + "#list-check-runs-for-a-git-reference"
	s.mu.Lock()
	defer s.mu.Unlock()
	repo, rep := s.repoWith(r, p, "checks", "read")
	if rep != nil {
		return *rep
	}
	ref, ok := strings.CutSuffix(r.PathValue("ref_check_runs"), "/check-runs")
	if !ok || ref == "" {
		return notFound()
	}
	q := r.URL.Query()
	sha, _, ok := s.resolveRef(repo, ref)
	if !ok {
		return errorReply(http.StatusUnprocessableEntity, "No commit found for SHA: "+ref, doc)
	}
	filter := q.Get("filter")
	if filter == "" {
		filter = "latest"
	}
	if filter != "latest" && filter != "all" {
		return invalidField("filter", filter, doc)
	}
	status := q.Get("status")
	if status != "" && !slices.Contains(checkRunStatuses, status) {
		return invalidField("status", status, doc)
	}
	var matched []*CheckRun
	for _, cr := range s.checkRuns {
		if cr.RepositoryID != repo.id || cr.HeadSHA != sha ||
			(q.Has("check_name") && cr.Name != q.Get("check_name")) ||
			(status != "" && cr.Status != status) ||
			(q.Has("app_id") && q.Get("app_id") != s.opts.AppID) {
			continue
		}
		matched = append(matched, cr)
	}
	slices.SortFunc(matched, func(a, b *CheckRun) int { return cmpDesc(a.ID, b.ID) })
	if filter == "latest" {
		seen := map[string]bool{}
		latest := matched[:0:0]
		for _, cr := range matched {
			if !seen[cr.Name] {
				seen[cr.Name] = true
				latest = append(latest, cr)
			}
		}
		matched = latest
	}
	page, perPage := pagination(q)
	items := []any{}
	for _, cr := range paginate(matched, page, perPage) {
		items = append(items, s.checkRunJSON(cr, apiBase(r)))
	}
	out := jsonReply(http.StatusOK, map[string]any{"total_count": len(matched), "check_runs": items})
	out.header = linkHeader(r, page, perPage, len(matched))
	return out
}

// checkRunJSON renders cr as GitHub's check run object.
func (s *Server) checkRunJSON(cr *CheckRun, base string) map[string]any {
	repoURL := base + "/repos/" + cr.Repository
	return map[string]any{
		"id":           cr.ID,
		"node_id":      nodeID("CR", cr.ID),
		"head_sha":     cr.HeadSHA,
		"external_id":  cr.ExternalID,
		"url":          repoURL + "/check-runs/" + itoa(cr.ID),
		"html_url":     s.opts.HTMLURL + "/" + cr.Repository + "/runs/" + itoa(cr.ID),
		"details_url":  orDefault(cr.DetailsURL, s.opts.HTMLURL+"/"+cr.Repository+"/runs/"+itoa(cr.ID)),
		"status":       cr.Status,
		"conclusion":   nullable(cr.Conclusion),
		"started_at":   nullableTime(cr.StartedAt),
		"completed_at": nullableTime(cr.CompletedAt),
		"output": map[string]any{
			"title":             nullable(cr.Output.Title),
			"summary":           nullable(cr.Output.Summary),
			"text":              nullable(cr.Output.Text),
			"annotations_count": 0,
			"annotations_url":   repoURL + "/check-runs/" + itoa(cr.ID) + "/annotations",
		},
		"name":          cr.Name,
		"check_suite":   map[string]any{"id": cr.CheckSuiteID},
		"app":           s.appJSON(),
		"pull_requests": []any{},
	}
}

func (s *Server) appJSON() map[string]any {
	id, _ := strconv.ParseInt(s.opts.AppID, 10, 64)
	return map[string]any{
		"id": id, "slug": s.opts.AppSlug, "node_id": nodeID("A", id), "name": s.opts.AppSlug,
		"html_url": s.opts.HTMLURL + "/apps/" + s.opts.AppSlug,
	}
}

// repoJSON renders r as GitHub's (abridged) repository object.
func (s *Server) repoJSON(r *repository, base string) map[string]any {
	return map[string]any{
		"id":             r.id,
		"node_id":        nodeID("R", r.id),
		"name":           r.name,
		"full_name":      r.fullName(),
		"private":        true,
		"owner":          s.accountJSON(r.owner),
		"html_url":       s.opts.HTMLURL + "/" + r.fullName(),
		"url":            base + "/repos/" + r.fullName(),
		"default_branch": r.defaultBranch,
	}
}

func (s *Server) accountJSON(login string) map[string]any {
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(login)))
	id := int64(h.Sum32()%90_000_000) + 10_000_000
	return map[string]any{
		"login": login, "id": id, "node_id": nodeID("U", id), "type": "Organization",
		"html_url": s.opts.HTMLURL + "/" + login,
	}
}

// permit answers 403 "Resource not accessible by integration" when p's
// token lacks permission at level; s.mu must be held.
func (s *Server) permit(p principal, permission, level string) *reply {
	if p.token != nil && permissionRank[p.token.permissions[permission]] >= permissionRank[level] {
		return nil
	}
	rep := errorReply(http.StatusForbidden, "Resource not accessible by integration", docRoot)
	return &rep
}

// SetPermissions replaces the permissions of installationID (e.g.
// {"checks": "read"}); tokens issued afterwards carry them, and so do the
// installation's existing tokens, as on GitHub once the change is accepted.
func (s *Server) SetPermissions(installationID int64, permissions map[string]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.installations[installationID]
	if !ok {
		return fmt.Errorf("githubtest: unknown installation %d", installationID)
	}
	inst.permissions = make(map[string]string, len(permissions))
	for k, v := range permissions {
		inst.permissions[k] = v
	}
	for _, tok := range s.tokens {
		if tok.installationID == installationID {
			tok.permissions = inst.permissions
		}
	}
	s.notify()
	return nil
}

func nodeID(prefix string, id int64) string {
	return prefix + "_kwDO" + base64.RawURLEncoding.EncodeToString([]byte(itoa(id)))
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func nullableTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return timestamp(t)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cmpDesc(a, b int64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	default:
		return 0
	}
}

// apiBase is the API root as the client reached it.
func apiBase(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}
