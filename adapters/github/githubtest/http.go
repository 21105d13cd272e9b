package githubtest

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Route names: GitHub's REST operation ids. FaultRule.Route and Call.Route
// use them.
const (
	RouteCreateInstallationToken = "apps/create-installation-access-token"
	RouteListCheckRunsForRef     = "checks/list-for-ref"
	RouteCreateCheckRun          = "checks/create"
	RouteGetCheckRun             = "checks/get"
	RouteUpdateCheckRun          = "checks/update"
	RouteGetWorkflow             = "actions/get-workflow"
	RouteDispatchWorkflow        = "actions/create-workflow-dispatch"
	RouteListWorkflowRuns        = "actions/list-workflow-runs"
	RouteListRepoWorkflowRuns    = "actions/list-workflow-runs-for-repo"
	RouteGetWorkflowRun          = "actions/get-workflow-run"
	// RouteUnknown names every request no route matches (answered 404).
	RouteUnknown = "unknown"
)

// Documentation URLs of error bodies.
const (
	docRoot          = "https://docs.github.com/rest"
	docRateLimit     = "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
	docSecondary     = "https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"
	docAccessToken   = "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"
	docAPIVersions   = "https://docs.github.com/rest/overview/api-versions"
	docCheckRuns     = "https://docs.github.com/rest/checks/runs"
	docDispatch      = "https://docs.github.com/rest/actions/workflows#create-a-workflow-dispatch-event"
	docWorkflows     = "https://docs.github.com/rest/actions/workflows"
	docWorkflowRuns  = "https://docs.github.com/rest/actions/workflow-runs"
	maxRequestBody   = 1 << 20
	anonymousLimit   = 60
	rateLimitWindow  = time.Hour
	resourceCore     = "core"
	mediaTypeHeader  = "github.v3; format=json"
	contentTypeJSON  = "application/json; charset=utf-8"
	requestIDHexBase = 0x1F2E
)

// authMode says which credential a route takes.
type authMode int

const (
	authNone authMode = iota
	authAppJWT
	authInstallationToken
)

// principal is who a request authenticated as.
type principal struct {
	mode           authMode // authNone when unauthenticated
	installationID int64
	token          *issuedToken
}

func (p principal) bucketKey() string {
	switch p.mode {
	case authAppJWT:
		return "app"
	case authInstallationToken:
		return "installation:" + itoa(p.installationID)
	default:
		return "anonymous"
	}
}

// reply is what a route handler answers; write renders it. Handlers never
// touch the ResponseWriter, so faults can drop, replace or corrupt a reply
// after the request was processed.
type reply struct {
	status int
	body   any         // JSON-encoded; nil → no body
	raw    []byte      // sent as is instead of body when non-nil
	header http.Header // extra headers
}

// apiError is GitHub's error body.
type apiError struct {
	Message          string       `json:"message"`
	Errors           []fieldError `json:"errors,omitempty"`
	DocumentationURL string       `json:"documentation_url"`
	Status           string       `json:"status"`
}

// fieldError is one entry of a 422 "Validation Failed" body.
type fieldError struct {
	Resource string `json:"resource"`
	Code     string `json:"code"`
	Field    string `json:"field"`
}

func jsonReply(status int, body any) reply { return reply{status: status, body: body} }

// errorReply is the one constructor of error responses.
func errorReply(status int, message, doc string, errs ...fieldError) reply {
	return reply{status: status, body: apiError{
		Message: message, Errors: errs, DocumentationURL: doc, Status: strconv.Itoa(status),
	}}
}

func notFound() reply { return errorReply(http.StatusNotFound, "Not Found", docRoot) }

func badJSON(doc string) reply {
	return errorReply(http.StatusBadRequest, "Problems parsing JSON", doc)
}

// missingField is GitHub's schema-validation answer for a required body
// parameter.
func missingField(field, doc string) reply {
	return errorReply(http.StatusUnprocessableEntity, fmt.Sprintf("Invalid request.\n\n%q wasn't supplied.", field), doc)
}

func invalidField(field string, value any, doc string) reply {
	v, _ := json.Marshal(value)
	return errorReply(http.StatusUnprocessableEntity, fmt.Sprintf("Invalid request.\n\nFor 'properties/%s', %s is not a valid value.", field, v), doc)
}

// decodeBody reads a JSON request body into v. An empty body leaves v
// untouched when allowEmpty.
func decodeBody(r *http.Request, v any, allowEmpty bool) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
	if err != nil || len(body) > maxRequestBody {
		return false
	}
	if len(body) == 0 {
		return allowEmpty
	}
	return json.Unmarshal(body, v) == nil
}

// route is one registered operation.
type route struct {
	name    string
	pattern string
	auth    authMode
	handle  func(r *http.Request, p principal) reply
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range []route{
		{RouteCreateInstallationToken, "POST /app/installations/{installation_id}/access_tokens", authAppJWT, s.createInstallationToken},
		// {ref} may contain slashes ("heads/main", "tags/v1.0.0"), which a
		// ServeMux wildcard cannot express mid-pattern.
		{RouteListCheckRunsForRef, "GET /repos/{owner}/{repo}/commits/{ref_check_runs...}", authInstallationToken, s.listCheckRunsForRef},
		{RouteCreateCheckRun, "POST /repos/{owner}/{repo}/check-runs", authInstallationToken, s.createCheckRun},
		{RouteGetCheckRun, "GET /repos/{owner}/{repo}/check-runs/{check_run_id}", authInstallationToken, s.getCheckRun},
		{RouteUpdateCheckRun, "PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}", authInstallationToken, s.updateCheckRun},
		{RouteGetWorkflow, "GET /repos/{owner}/{repo}/actions/workflows/{workflow_id}", authInstallationToken, s.getWorkflow},
		{RouteDispatchWorkflow, "POST /repos/{owner}/{repo}/actions/workflows/{workflow_id}/dispatches", authInstallationToken, s.dispatchWorkflow},
		{RouteListWorkflowRuns, "GET /repos/{owner}/{repo}/actions/workflows/{workflow_id}/runs", authInstallationToken, s.listWorkflowRuns},
		{RouteListRepoWorkflowRuns, "GET /repos/{owner}/{repo}/actions/runs", authInstallationToken, s.listWorkflowRuns},
		{RouteGetWorkflowRun, "GET /repos/{owner}/{repo}/actions/runs/{run_id}", authInstallationToken, s.getWorkflowRun},
		{RouteUnknown, "/", authNone, func(*http.Request, principal) reply { return notFound() }},
	} {
		mux.Handle(rt.pattern, s.serve(rt))
	}
	return mux
}

// serve is the pipeline every request goes through: call log, delays,
// faults, API version, authentication, primary rate limit, the handler,
// post-processing faults, and write.
func (s *Server) serve(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := s.beginCall(r, rt.name)
		// Read the body first: the server notices a client that hangs up
		// (cancelling r.Context(), which delays honour) only once the body
		// was consumed.
		body, _ := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
		r.Body = io.NopCloser(bytes.NewReader(body))
		fault := s.takeFault(r.Method, rt.name, r.URL.Path)
		kind := FaultKind(0)
		if fault != nil {
			kind = fault.Kind
		}
		s.mu.Lock()
		delay := s.delay
		s.mu.Unlock()
		if !wait(r.Context(), delay) || (kind == FaultDelay && !wait(r.Context(), fault.Delay)) {
			s.endCall(call, 0, kind, 0) // the client gave up; nothing was processed
			return
		}
		if kind == FaultResetBeforeProcessing {
			s.endCall(call, 0, kind, 0)
			abort(w)
			return
		}

		p, authFailure := s.authenticate(r, rt.auth)
		preFault := fault != nil && (kind == FaultStatus || kind == FaultSecondaryRateLimit) && !fault.Process
		var rep reply
		switch {
		case preFault:
			rep = s.faultReply(fault, p)
		case rt.name != RouteUnknown && !supportedVersion(r.Header.Get("X-GitHub-Api-Version")):
			rep = errorReply(http.StatusBadRequest, fmt.Sprintf("API version %s is not supported.", r.Header.Get("X-GitHub-Api-Version")), docAPIVersions)
		case authFailure != nil:
			rep = *authFailure
		default:
			if limited := s.consumeRateLimit(p); limited != nil {
				rep = *limited
				break
			}
			rep = rt.handle(r, p)
			switch {
			case kind == FaultLoseResponse:
				s.endCall(call, 0, kind, p.installationID)
				abort(w)
				return
			case kind == FaultMalformedBody:
				s.write(w, r, p, rep, true)
				s.endCall(call, malformedStatus(rep.status), kind, p.installationID)
				return
			case fault != nil && fault.Process && (kind == FaultStatus || kind == FaultSecondaryRateLimit):
				rep = s.faultReply(fault, p)
			}
		}
		s.write(w, r, p, rep, false)
		s.endCall(call, rep.status, kind, p.installationID)
	})
}

func supportedVersion(v string) bool { return v == "" || v == APIVersion }

// write is the one place responses are rendered: GitHub's common headers,
// the rate-limit headers of p's bucket, and the JSON body (cut in half when
// malformed).
func (s *Server) write(w http.ResponseWriter, r *http.Request, p principal, rep reply, malformed bool) {
	h := w.Header()
	for k, vs := range rep.header {
		h[k] = vs
	}
	now := s.now()
	h.Set("Date", now.UTC().Format(http.TimeFormat))
	h.Set("X-GitHub-Request-Id", s.requestID())
	h.Set("X-GitHub-Media-Type", mediaTypeHeader)
	h.Set("X-GitHub-Api-Version-Selected", APIVersion)
	limit, remaining, used, reset := s.rateLimitState(p, now)
	h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
	h.Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	h.Set("X-RateLimit-Used", strconv.Itoa(used))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
	h.Set("X-RateLimit-Resource", resourceCore)

	status := rep.status
	body, contentType := rep.raw, contentTypeJSON
	if body != nil && !json.Valid(body) {
		contentType = "text/html; charset=utf-8"
	}
	if body == nil && rep.body != nil {
		var err error
		if body, err = json.Marshal(rep.body); err != nil {
			status, body = http.StatusInternalServerError, []byte(`{"message":"Server Error"}`)
		}
	}
	if malformed {
		status = malformedStatus(status)
		if len(body) < 2 {
			body = []byte(`{"id":`)
		}
		body = body[:len(body)/2]
	}
	if body != nil {
		h.Set("Content-Type", contentType)
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if r.Method != http.MethodHead && body != nil {
		_, _ = w.Write(body)
	}
}

func malformedStatus(status int) int {
	if status == http.StatusNoContent || status < 200 || status > 299 {
		return http.StatusOK
	}
	return status
}

// abort closes the connection without a response: by hijacking it, or, on
// a ResponseWriter that cannot be hijacked (HTTP/2), by aborting the
// handler.
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// wait blocks for d or until ctx is done; it reports whether d elapsed.
func wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *Server) requestID() string {
	s.mu.Lock()
	s.requestSeq++
	n := s.requestSeq
	s.mu.Unlock()
	return fmt.Sprintf("%04X:%04X:%06X:%06X:%08X", requestIDHexBase, n%0xFFFF, n, n*7%0xFFFFFF, uint32(n*2654435761))
}

// rateBucket is one primary rate-limit window.
type rateBucket struct {
	limit int
	used  int
	reset time.Time
}

// bucket returns p's current window, renewed when it elapsed; s.mu must be
// held.
func (s *Server) bucket(p principal, now time.Time) *rateBucket {
	key := p.bucketKey()
	b := s.buckets[key]
	if b == nil {
		limit := s.opts.RateLimit
		if p.mode == authNone {
			limit = anonymousLimit
		}
		b = &rateBucket{limit: limit}
		s.buckets[key] = b
	}
	if !now.Before(b.reset) {
		b.used = 0
		b.reset = now.Add(rateLimitWindow).Truncate(time.Second)
	}
	return b
}

// consumeRateLimit counts one request against p's primary limit, or refuses
// it when the window is exhausted.
func (s *Server) consumeRateLimit(p principal) *reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	b := s.bucket(p, now)
	if b.used >= b.limit {
		who := "app ID " + s.opts.AppID
		if p.mode == authInstallationToken {
			who = "installation ID " + itoa(p.installationID)
		}
		rep := errorReply(s.opts.RateLimitStatus, fmt.Sprintf(
			"API rate limit exceeded for %s. If you reach out to GitHub Support for help, please include the request ID and timestamp %s.",
			who, now.UTC().Format("2006-01-02 15:04:05 MST")), docRateLimit)
		return &rep
	}
	if p.mode != authNone {
		b.used++
	}
	return nil
}

func (s *Server) rateLimitState(p principal, now time.Time) (limit, remaining, used int, reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bucket(p, now)
	return b.limit, max(b.limit-b.used, 0), b.used, b.reset
}

// SetRateLimit sets the remaining primary quota of installationID (0 for
// the app's own JWT-authenticated quota) and, when reset is not zero, the
// end of the current window.
func (s *Server) SetRateLimit(installationID int64, remaining int, reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := principal{mode: authAppJWT}
	if installationID != 0 {
		p = principal{mode: authInstallationToken, installationID: installationID}
	}
	b := s.bucket(p, s.now())
	b.used = min(max(b.limit-remaining, 0), b.limit)
	if !reset.IsZero() {
		b.reset = reset
	}
	s.notify()
}

func syntheticSHA(repo, ref string) string {
	sum := sha1.Sum([]byte(repo + "\x00" + ref))
	return hex.EncodeToString(sum[:])
}

// retryAfterSeconds renders d as a whole number of seconds, rounded up.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
}
