package github

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/internal/httpout"
)

// responseLimit bounds how much of a response body is read.
const responseLimit = 4 << 20

// Pagination of the list calls.
const (
	// PerPage is the page size the list calls ask for: GitHub's maximum.
	PerPage = 100
	// MaxPages bounds the pages one list call reads (10,000 items).
	MaxPages = 100
	// SearchLimit is the most results GitHub returns for a workflow-run
	// listing filtered by actor, branch, check_suite_id, created, event,
	// head_sha or status ("List workflow runs for a workflow").
	SearchLimit = 1000
)

// CheckRunConclusions are the conclusions a Check Run may be given on create
// or update (GitHub's "Update a check run"). GitHub's own "stale" is not
// among them: only GitHub may set it.
var CheckRunConclusions = []string{"action_required", "cancelled", "failure", "neutral", "success", "skipped", "timed_out"}

// CheckRunConclusion maps a workflow run's conclusion to one a Check Run may
// be given, never to one that reads as more successful than the run was:
//
//   - success, failure, neutral, cancelled, skipped, timed_out and
//     action_required are kept;
//   - stale (GitHub gave up on a run left incomplete) becomes timed_out;
//   - startup_failure (the workflow file could not start) becomes failure;
//   - "" (null: no conclusion) becomes neutral;
//   - anything else (a conclusion GitHub may add later) becomes
//     action_required: someone has to look.
func CheckRunConclusion(workflowConclusion string) string {
	switch workflowConclusion {
	case "stale":
		return "timed_out"
	case "startup_failure":
		return "failure"
	case "":
		return "neutral"
	}
	if slices.Contains(CheckRunConclusions, workflowConclusion) {
		return workflowConclusion
	}
	return "action_required"
}

// Client calls the GitHub REST endpoints the release control plane needs,
// as an installation, and classifies every failure as a pgoutbox outcome
// (docs/controlplane.md, "Effects"): 401/404/422 and 403 "Resource not
// accessible by integration" are permanent; 403/429 with rate-limit headers
// retry after the reset or Retry-After (delay-seconds or an HTTP-date, both
// measured from the answer's Date); 5xx and transport errors retry for
// replay-safe calls and are ambiguous for a dispatch (unless the request
// provably never left: a dial error).
//
// go-github is not used: its dispatch call cannot send return_run_details
// and read the 200 body, which is the one call that matters most here.
type Client struct {
	http   *http.Client
	api    string
	tokens *TokenSource
}

// NewClient returns a client for apiURL (DefaultAPIURL when empty) using
// installation tokens from tokens. httpClient's timeout should stay below the
// delivery timeout; nil uses one with a 20 s timeout.
func NewClient(httpClient *http.Client, apiURL string, tokens *TokenSource) *Client {
	if httpClient == nil {
		httpClient = &http.Client{Timeout: 20 * time.Second}
	}
	if apiURL == "" {
		apiURL = DefaultAPIURL
	}
	return &Client{http: httpClient, api: strings.TrimRight(apiURL, "/"), tokens: tokens}
}

// CheckRun is the part of a Check Run the control plane uses.
type CheckRun struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	HeadSHA    string `json:"head_sha"`
	ExternalID string `json:"external_id"`
	Status     string `json:"status"`
	Conclusion string `json:"conclusion"`
}

// WorkflowRun is the part of a workflow run the control plane uses.
type WorkflowRun struct {
	ID           int64     `json:"id"`
	Name         string    `json:"name"`
	DisplayTitle string    `json:"display_title"`
	Event        string    `json:"event"`
	Status       string    `json:"status"`
	Conclusion   string    `json:"conclusion"`
	HeadBranch   string    `json:"head_branch"`
	HeadSHA      string    `json:"head_sha"`
	CreatedAt    time.Time `json:"created_at"`
	HTMLURL      string    `json:"html_url"`
	// WorkflowID and Path name the run's workflow (Path is its file,
	// ".github/workflows/release.yml").
	WorkflowID int64  `json:"workflow_id"`
	Path       string `json:"path"`
}

// DispatchResult is the answer to a dispatch with return_run_details.
type DispatchResult struct {
	WorkflowRunID int64  `json:"workflow_run_id"`
	RunURL        string `json:"run_url"`
	HTMLURL       string `json:"html_url"`
}

func repoPath(fullName string) (string, error) {
	owner, name, ok := strings.Cut(fullName, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") {
		return "", pgoutbox.Permanent(fmt.Errorf("github: invalid repository %q", fullName))
	}
	return "/repos/" + url.PathEscape(owner) + "/" + url.PathEscape(name), nil
}

// ListCheckRuns lists the Check Runs named name on ref (a commit SHA),
// following GitHub's pagination (Link rel="next", 100 per page) to the last
// page.
func (c *Client) ListCheckRuns(ctx context.Context, installationID int64, repo, ref, name string) ([]CheckRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return nil, err
	}
	q := url.Values{"check_name": {name}, "filter": {"all"}, "per_page": {strconv.Itoa(PerPage)}}
	var all []CheckRun
	_, err = c.pages(ctx, installationID, p+"/commits/"+url.PathEscape(ref)+"/check-runs?"+q.Encode(), func(data []byte) (int, error) {
		var page struct {
			TotalCount int        `json:"total_count"`
			CheckRuns  []CheckRun `json:"check_runs"`
		}
		err := json.Unmarshal(data, &page)
		all = append(all, page.CheckRuns...)
		return page.TotalCount, err
	})
	return dedupe(all, func(r CheckRun) int64 { return r.ID }), err
}

// CreateCheckRun creates an in-progress Check Run.
func (c *Client) CreateCheckRun(ctx context.Context, installationID int64, repo, name, headSHA, externalID string) (CheckRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return CheckRun{}, err
	}
	body := map[string]any{"name": name, "head_sha": headSHA, "external_id": externalID, "status": "in_progress"}
	var out CheckRun
	err = c.do(ctx, installationID, http.MethodPost, p+"/check-runs", body, &out, true)
	if err == nil && out.ID == 0 {
		err = pgoutbox.Retry(errors.New("github: create check run: 2xx without an id"))
	}
	return out, err
}

// CompleteCheckRun sets a Check Run's conclusion, which must be one a Check
// Run may be given (CheckRunConclusions; GitHub alone sets "stale"):
// anything else is refused as permanent without a request. Map a workflow
// run's conclusion with CheckRunConclusion first.
func (c *Client) CompleteCheckRun(ctx context.Context, installationID int64, repo string, checkRunID int64, conclusion string) error {
	p, err := repoPath(repo)
	if err != nil {
		return err
	}
	if !slices.Contains(CheckRunConclusions, conclusion) {
		return pgoutbox.Permanent(fmt.Errorf("github: %q is not a conclusion a Check Run may be given (one of %s)",
			conclusion, strings.Join(CheckRunConclusions, ", ")))
	}
	body := map[string]any{"status": "completed", "conclusion": conclusion}
	return c.do(ctx, installationID, http.MethodPatch, p+"/check-runs/"+strconv.FormatInt(checkRunID, 10), body, nil, true)
}

// DispatchWorkflow dispatches workflow on ref with inputs and
// return_run_details: true. It is not idempotent: any failure after the
// request may have been sent is Ambiguous.
func (c *Client) DispatchWorkflow(ctx context.Context, installationID int64, repo, workflow, ref string, inputs map[string]string) (DispatchResult, error) {
	p, err := repoPath(repo)
	if err != nil {
		return DispatchResult{}, err
	}
	body := map[string]any{"ref": ref, "inputs": inputs, "return_run_details": true}
	var out DispatchResult
	err = c.do(ctx, installationID, http.MethodPost, p+"/actions/workflows/"+url.PathEscape(workflow)+"/dispatches", body, &out, false)
	if err == nil && out.WorkflowRunID == 0 {
		err = pgoutbox.Ambiguous(errors.New("github: dispatch answered 2xx without workflow_run_id"))
	}
	return out, err
}

// ListWorkflowRuns lists the workflow_dispatch runs of workflow created at
// or after since, following GitHub's pagination (Link rel="next", 100 per
// page) to the last page. GitHub returns at most SearchLimit runs for a
// filtered listing; when the window holds that many or more (or fewer came
// back than GitHub counted) the answer would be incomplete, so it is an
// error naming the counts instead.
func (c *Client) ListWorkflowRuns(ctx context.Context, installationID int64, repo, workflow string, since time.Time) ([]WorkflowRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return nil, err
	}
	q := url.Values{"event": {"workflow_dispatch"}, "per_page": {strconv.Itoa(PerPage)},
		"created": {">=" + since.UTC().Format(time.RFC3339)}}
	var all []WorkflowRun
	total, err := c.pages(ctx, installationID, p+"/actions/workflows/"+url.PathEscape(workflow)+"/runs?"+q.Encode(), func(data []byte) (int, error) {
		var page struct {
			TotalCount   int           `json:"total_count"`
			WorkflowRuns []WorkflowRun `json:"workflow_runs"`
		}
		err := json.Unmarshal(data, &page)
		all = append(all, page.WorkflowRuns...)
		return page.TotalCount, err
	})
	if err != nil {
		return nil, err
	}
	all = dedupe(all, func(r WorkflowRun) int64 { return r.ID })
	if len(all) >= SearchLimit || len(all) < total {
		return nil, pgoutbox.Permanent(fmt.Errorf("github: list workflow runs: %d runs listed of %d counted since %s, "+
			"and GitHub lists at most %d per filtered search: the listing may be incomplete",
			len(all), total, since.UTC().Format(time.RFC3339), SearchLimit))
	}
	return all, nil
}

// pages GETs path and every page its Link header's rel="next" names, handing
// each 2xx body to page, which decodes it and returns the total_count it
// states. It returns the first page's total_count. A next link must stay on
// the API's scheme, host and path (the token is never sent elsewhere), may
// not repeat, and at most MaxPages pages are read.
func (c *Client) pages(ctx context.Context, installationID int64, path string, page func([]byte) (int, error)) (int, error) {
	base, err := url.Parse(c.api)
	if err != nil {
		return 0, pgoutbox.Permanent(fmt.Errorf("github: API URL: %w", err))
	}
	target := c.api + path
	op := "GET " + strings.SplitN(path, "?", 2)[0]
	seen := map[string]bool{}
	first := -1
	for n := 0; ; n++ {
		if n == MaxPages {
			return 0, pgoutbox.Permanent(fmt.Errorf("github: %s: more than %d pages", op, MaxPages))
		}
		seen[target] = true
		var body []byte
		h, err := c.send(ctx, installationID, http.MethodGet, target, nil, &body, true)
		if err != nil {
			return 0, err
		}
		total, err := page(body)
		if err != nil {
			return 0, pgoutbox.Retry(fmt.Errorf("github: %s: malformed page %d: %v", op, n+1, err))
		}
		if first < 0 {
			first = total
		}
		next, ok := nextLink(h.Values("Link"))
		if !ok {
			return first, nil
		}
		u, err := base.Parse(next)
		if err != nil || u.Scheme != base.Scheme || u.Host != base.Host ||
			!strings.HasPrefix(u.Path, strings.TrimRight(base.Path, "/")+"/") {
			return 0, pgoutbox.Permanent(fmt.Errorf("github: %s: the next-page link leaves the API (%s)", op, u.Redacted()))
		}
		if target = u.String(); seen[target] {
			return 0, pgoutbox.Permanent(fmt.Errorf("github: %s: the next-page link repeats page %s", op, u.RawQuery))
		}
	}
}

// nextLink returns the URL of rel="next" in RFC 8288 Link header values.
func nextLink(values []string) (string, bool) {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
			target = strings.TrimSpace(target)
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for p := range strings.SplitSeq(params, ";") {
				k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				if !strings.EqualFold(strings.TrimSpace(k), "rel") {
					continue
				}
				for rel := range strings.FieldsSeq(strings.Trim(strings.TrimSpace(val), `"`)) {
					if strings.EqualFold(rel, "next") {
						return target[1 : len(target)-1], true
					}
				}
			}
		}
	}
	return "", false
}

// dedupe keeps the first item of every id: a list that changes while it is
// paged through can repeat an item on the next page.
func dedupe[T any](items []T, id func(T) int64) []T {
	seen := make(map[int64]bool, len(items))
	out := items[:0]
	for _, it := range items {
		if !seen[id(it)] {
			seen[id(it)] = true
			out = append(out, it)
		}
	}
	return out
}

// do sends one request to the API path as the installation, decodes a 2xx
// JSON body into out (when not nil) and classifies the outcome.
func (c *Client) do(ctx context.Context, installationID int64, method, path string, body, out any, idempotent bool) error {
	var data []byte
	if _, err := c.send(ctx, installationID, method, c.api+path, body, &data, idempotent); err != nil {
		return err
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			err := fmt.Errorf("github: %s %s: malformed response: %v", method, strings.SplitN(path, "?", 2)[0], err)
			if idempotent {
				return pgoutbox.Retry(err)
			}
			return pgoutbox.Ambiguous(err)
		}
	}
	return nil
}

// send sends one request to the absolute URL target as the installation and
// classifies the outcome; on a 2xx it stores the body in *data and returns
// the response headers.
func (c *Client) send(ctx context.Context, installationID int64, method, target string, body any, data *[]byte, idempotent bool) (http.Header, error) {
	token, err := c.tokens.Token(ctx, installationID)
	if err != nil {
		var te *TokenError
		if errors.As(err, &te) && !te.Temporary() {
			return nil, pgoutbox.Permanent(err)
		}
		return nil, pgoutbox.Retry(err) // nothing was sent
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, pgoutbox.Permanent(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		return nil, pgoutbox.Permanent(fmt.Errorf("github: build request: %w", err))
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", APIVersion)
	req.Header.Set("User-Agent", "pgoutbox")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	op := method + " " + strings.TrimPrefix(req.URL.Path, strings.TrimRight(c.apiPath(), "/"))
	resp, err := c.http.Do(req)
	if err != nil {
		err = fmt.Errorf("github: %s: %w", op, scrub(err, token))
		if idempotent || neverSent(err) {
			return nil, pgoutbox.Retry(err)
		}
		return nil, pgoutbox.Ambiguous(err)
	}
	defer resp.Body.Close()
	b, readErr := io.ReadAll(io.LimitReader(resp.Body, responseLimit))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if readErr != nil {
			err := fmt.Errorf("github: %s: malformed %d response: %v", op, resp.StatusCode, readErr)
			if idempotent {
				return nil, pgoutbox.Retry(err)
			}
			return nil, pgoutbox.Ambiguous(err)
		}
		*data = b
		return resp.Header, nil
	}
	return nil, classify(op, resp, b, idempotent, c.tokens, installationID)
}

// apiPath is the path part of the API URL ("" for api.github.com).
func (c *Client) apiPath() string {
	if u, err := url.Parse(c.api); err == nil {
		return u.Path
	}
	return ""
}

// classify maps a non-2xx answer to an outcome.
func classify(op string, resp *http.Response, data []byte, idempotent bool, tokens *TokenSource, installationID int64) error {
	var msg struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(data, &msg)
	if len(msg.Message) > 200 {
		msg.Message = msg.Message[:200]
	}
	err := fmt.Errorf("github: %s: %d %s", op, resp.StatusCode, msg.Message)
	code := resp.StatusCode
	if wait, limited := rateLimited(resp); limited {
		return pgoutbox.RetryAfter(wait, err)
	}
	switch {
	case code == http.StatusUnauthorized:
		tokens.Invalidate(installationID)
		return pgoutbox.Permanent(err)
	case code == http.StatusNotFound:
		return pgoutbox.Permanent(&notFoundError{err})
	case code == http.StatusForbidden, code == http.StatusNotFound, code == http.StatusUnprocessableEntity,
		code == http.StatusBadRequest, code == http.StatusGone:
		return pgoutbox.Permanent(err)
	case code == http.StatusTooManyRequests:
		return pgoutbox.RetryAfter(time.Minute, err)
	case code >= 500:
		if idempotent {
			return pgoutbox.Retry(err)
		}
		return pgoutbox.Ambiguous(err)
	}
	return pgoutbox.Permanent(err)
}

// rateLimited reads GitHub's rate-limit answers on 403 and 429 (see
// rateLimitWait), measured against the response's own Date so that this
// host's clock does not matter.
func rateLimited(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
		return 0, false
	}
	return rateLimitWait(resp.Header, httpout.ServerNow(resp.Header, time.Now()))
}

// rateLimitWait reads the wait GitHub asks for: Retry-After, seconds or an
// HTTP-date (secondary limits), or, when x-ratelimit-remaining is 0,
// x-ratelimit-reset in epoch seconds (primary limits; a minute when the
// reset is unreadable, at least a second when it has passed). ok is false
// when the answer asks for no wait.
func rateLimitWait(h http.Header, now time.Time) (time.Duration, bool) {
	if d, ok := httpout.RetryAfter(h, now); ok {
		return d, true
	}
	if h.Get("X-RateLimit-Remaining") == "0" {
		reset, err := strconv.ParseInt(strings.TrimSpace(h.Get("X-RateLimit-Reset")), 10, 64)
		if err != nil {
			return time.Minute, true
		}
		return max(time.Unix(reset, 0).Sub(now), time.Second), true
	}
	return 0, false
}

// neverSent reports a transport error that happened before the request
// could reach the server (dial or DNS failure).
func neverSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// scrub removes the token from an error's text.
func scrub(err error, token string) error {
	if token == "" || !strings.Contains(err.Error(), token) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), token, "[redacted]"))
}
