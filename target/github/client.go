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
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// responseLimit bounds how much of a response body is read.
const responseLimit = 4 << 20

// Client calls the GitHub REST endpoints the release control plane needs,
// as an installation, and classifies every failure as a pgoutbox outcome
// (docs/design.md, "GitHub App auth"): 401/404/422 and 403 "Resource not
// accessible by integration" are permanent; 403/429 with rate-limit headers
// retry after the reset or Retry-After; 5xx and transport errors retry for
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

// ListCheckRuns lists the Check Runs named name on ref (a commit SHA).
func (c *Client) ListCheckRuns(ctx context.Context, installationID int64, repo, ref, name string) ([]CheckRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return nil, err
	}
	q := url.Values{"check_name": {name}, "filter": {"all"}, "per_page": {"100"}}
	var out struct {
		CheckRuns []CheckRun `json:"check_runs"`
	}
	err = c.do(ctx, installationID, http.MethodGet, p+"/commits/"+url.PathEscape(ref)+"/check-runs?"+q.Encode(), nil, &out, true)
	return out.CheckRuns, err
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

// CompleteCheckRun sets a Check Run's conclusion.
func (c *Client) CompleteCheckRun(ctx context.Context, installationID int64, repo string, checkRunID int64, conclusion string) error {
	p, err := repoPath(repo)
	if err != nil {
		return err
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
// or after since.
func (c *Client) ListWorkflowRuns(ctx context.Context, installationID int64, repo, workflow string, since time.Time) ([]WorkflowRun, error) {
	p, err := repoPath(repo)
	if err != nil {
		return nil, err
	}
	q := url.Values{"event": {"workflow_dispatch"}, "per_page": {"100"},
		"created": {">=" + since.UTC().Format(time.RFC3339)}}
	var out struct {
		WorkflowRuns []WorkflowRun `json:"workflow_runs"`
	}
	err = c.do(ctx, installationID, http.MethodGet, p+"/actions/workflows/"+url.PathEscape(workflow)+"/runs?"+q.Encode(), nil, &out, true)
	return out.WorkflowRuns, err
}

// do sends one request as the installation and classifies the outcome.
func (c *Client) do(ctx context.Context, installationID int64, method, path string, body, out any, idempotent bool) error {
	token, err := c.tokens.Token(ctx, installationID)
	if err != nil {
		var te *TokenError
		if errors.As(err, &te) && !te.Temporary() {
			return pgoutbox.Permanent(err)
		}
		return pgoutbox.Retry(err) // nothing was sent
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return pgoutbox.Permanent(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.api+path, rd)
	if err != nil {
		return pgoutbox.Permanent(fmt.Errorf("github: build request: %w", err))
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", APIVersion)
	req.Header.Set("User-Agent", "pgoutbox")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	op := method + " " + strings.SplitN(path, "?", 2)[0]
	resp, err := c.http.Do(req)
	if err != nil {
		err = fmt.Errorf("github: %s: %w", op, scrub(err, token))
		if idempotent || neverSent(err) {
			return pgoutbox.Retry(err)
		}
		return pgoutbox.Ambiguous(err)
	}
	defer resp.Body.Close()
	data, readErr := io.ReadAll(io.LimitReader(resp.Body, responseLimit))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if readErr == nil && out != nil && len(bytes.TrimSpace(data)) > 0 {
			readErr = json.Unmarshal(data, out)
		}
		if readErr != nil {
			err := fmt.Errorf("github: %s: malformed %d response: %v", op, resp.StatusCode, readErr)
			if idempotent {
				return pgoutbox.Retry(err)
			}
			return pgoutbox.Ambiguous(err)
		}
		return nil
	}
	return classify(op, resp, data, idempotent, c.tokens, installationID)
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

// rateLimited reads GitHub's rate-limit answers: Retry-After (secondary
// limits), or x-ratelimit-remaining: 0 with x-ratelimit-reset (primary
// limits, measured against the response's own Date so that this host's
// clock does not matter).
func rateLimited(resp *http.Response) (time.Duration, bool) {
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
		return 0, false
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			return time.Duration(n) * time.Second, true
		}
	}
	if resp.Header.Get("X-RateLimit-Remaining") == "0" {
		reset, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
		if err != nil {
			return time.Minute, true
		}
		now := time.Now()
		if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
			now = d
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
