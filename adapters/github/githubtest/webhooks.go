package githubtest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

// ErrDeliveryRejected is wrapped by the error of a webhook delivery the
// receiver answered with a non-2xx status.
var ErrDeliveryRejected = errors.New("githubtest: webhook delivery rejected")

// ErrNoWebhook is returned by Redeliver when no webhook is configured.
var ErrNoWebhook = errors.New("githubtest: no webhook configured")

// Delivery is one webhook delivery attempt.
type Delivery struct {
	// ID is the X-GitHub-Delivery GUID (repeated by Redeliver).
	ID string
	// Event and Action describe the payload.
	Event, Action string
	// Body is the exact payload sent (and signed).
	Body []byte
	// Header holds the request headers sent.
	Header http.Header
	// StatusCode is the receiver's status; 0 when the request failed.
	StatusCode int
	// ResponseBody is the start (at most 4 KiB) of the receiver's answer.
	ResponseBody []byte
	// Err describes a transport failure; "" otherwise.
	Err string
	// Redelivery is true for deliveries made by Redeliver.
	Redelivery bool
	// At is when the delivery was sent.
	At time.Time
}

// DeliverWebhook sends payload (a []byte or json.RawMessage sent as is,
// anything else JSON-encoded) as event to Options.WebhookURL, signed like
// GitHub does. It returns (nil, nil) when no webhook is configured. The
// error is non-nil on transport failure or a non-2xx answer (wrapping
// ErrDeliveryRejected); the Delivery is returned in both cases.
func (s *Server) DeliverWebhook(ctx context.Context, event string, payload any) (*Delivery, error) {
	if s.opts.WebhookURL == "" {
		return nil, nil
	}
	var body []byte
	switch p := payload.(type) {
	case []byte:
		body = p
	case json.RawMessage:
		body = p
	default:
		var err error
		if body, err = json.Marshal(payload); err != nil {
			return nil, fmt.Errorf("githubtest: encoding the %s payload: %w", event, err)
		}
	}
	var envelope struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(body, &envelope)
	id, err := uuid4()
	if err != nil {
		return nil, err
	}
	return s.send(ctx, Delivery{ID: id, Event: event, Action: envelope.Action, Body: body})
}

// Redeliver sends the delivery with GUID id again, with the same GUID and
// body, as GitHub's "Redeliver" button does.
func (s *Server) Redeliver(ctx context.Context, id string) (*Delivery, error) {
	if s.opts.WebhookURL == "" {
		return nil, ErrNoWebhook
	}
	s.mu.Lock()
	i := slices.IndexFunc(s.deliveries, func(d Delivery) bool { return d.ID == id })
	var d Delivery
	if i >= 0 {
		d = s.deliveries[i]
	}
	s.mu.Unlock()
	if i < 0 {
		return nil, fmt.Errorf("githubtest: unknown delivery %s", id)
	}
	return s.send(ctx, Delivery{ID: d.ID, Event: d.Event, Action: d.Action, Body: d.Body, Redelivery: true})
}

func (s *Server) send(ctx context.Context, d Delivery) (*Delivery, error) {
	d.At = s.now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.opts.WebhookURL, bytes.NewReader(d.Body))
	if err != nil {
		return nil, fmt.Errorf("githubtest: webhook request: %w", err)
	}
	sha1Mac := hmac.New(sha1.New, s.opts.WebhookSecret)
	sha1Mac.Write(d.Body)
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "GitHub-Hookshot/044aadd")
	h.Set("X-GitHub-Event", d.Event)
	h.Set("X-GitHub-Delivery", d.ID)
	h.Set("X-GitHub-Hook-ID", itoa(s.opts.HookID))
	h.Set("X-GitHub-Hook-Installation-Target-ID", s.opts.AppID)
	h.Set("X-GitHub-Hook-Installation-Target-Type", "integration")
	h.Set("X-Hub-Signature", "sha1="+hex.EncodeToString(sha1Mac.Sum(nil)))
	h.Set(webhook.SignatureHeader, webhook.Sign(s.opts.WebhookSecret, d.Body))
	d.Header = h.Clone()

	resp, err := s.hookClient.Do(req)
	if err != nil {
		d.Err = err.Error()
	} else {
		d.StatusCode = resp.StatusCode
		d.ResponseBody, _ = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}
	s.mu.Lock()
	s.deliveries = append(s.deliveries, d)
	s.notify()
	s.mu.Unlock()
	switch {
	case err != nil:
		return &d, fmt.Errorf("githubtest: delivering %s %s: %w", d.Event, d.ID, err)
	case d.StatusCode < 200 || d.StatusCode > 299:
		return &d, fmt.Errorf("%w: %s %s answered %d", ErrDeliveryRejected, d.Event, d.ID, d.StatusCode)
	}
	return &d, nil
}

// CompleteRun completes workflow run runID with conclusion (success,
// failure, cancelled, …) and delivers the workflow_run "completed" webhook.
// The Delivery is nil when no webhook is configured.
func (s *Server) CompleteRun(ctx context.Context, runID int64, conclusion string) (*Delivery, error) {
	if !slices.Contains(runConclusions, conclusion) {
		return nil, fmt.Errorf("githubtest: invalid conclusion %q", conclusion)
	}
	return s.transitionRun(ctx, runID, "completed", func(run *WorkflowRun) error {
		if run.Status == "completed" {
			return fmt.Errorf("githubtest: run %d is already completed", runID)
		}
		run.Status, run.Conclusion = "completed", conclusion
		return nil
	})
}

// StartRun moves workflow run runID to in_progress and delivers the
// workflow_run "in_progress" webhook.
func (s *Server) StartRun(ctx context.Context, runID int64) (*Delivery, error) {
	return s.transitionRun(ctx, runID, "in_progress", func(run *WorkflowRun) error {
		if run.Status != "queued" {
			return fmt.Errorf("githubtest: run %d is %s, not queued", runID, run.Status)
		}
		run.Status = "in_progress"
		return nil
	})
}

func (s *Server) transitionRun(ctx context.Context, runID int64, action string, apply func(*WorkflowRun) error) (*Delivery, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.runs, func(r *WorkflowRun) bool { return r.ID == runID })
	if i < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("githubtest: unknown workflow run %d", runID)
	}
	run := s.runs[i]
	if err := apply(run); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	run.UpdatedAt = s.now().UTC().Truncate(time.Second)
	repo := s.reposByID[run.RepositoryID]
	var w *Workflow
	for _, candidate := range repo.workflows {
		if candidate.ID == run.WorkflowID {
			w = candidate
		}
	}
	base := s.webhookAPIBase()
	payload := map[string]any{
		"action":       action,
		"workflow_run": s.runJSON(run, base),
		"workflow":     s.workflowJSON(repo, w, base),
		"repository":   s.repoJSON(repo, base),
		"organization": s.accountJSON(repo.owner),
		"sender":       map[string]any{"login": s.opts.AppSlug + "[bot]", "id": 41898282, "type": "Bot"},
		"installation": map[string]any{"id": repo.installationID, "node_id": nodeID("I", repo.installationID)},
	}
	s.notify()
	s.mu.Unlock()
	return s.DeliverWebhook(ctx, "workflow_run", payload)
}

// Push points ref ("refs/tags/v1.0.0" or "refs/heads/main") of
// repoFullName at sha and delivers the push webhook GitHub sends for it.
func (s *Server) Push(ctx context.Context, repoFullName, ref, sha string) (*Delivery, error) {
	if !strings.HasPrefix(ref, "refs/") {
		return nil, fmt.Errorf("githubtest: Push needs a full ref, got %q", ref)
	}
	if !isSHA(sha) {
		return nil, fmt.Errorf("githubtest: %q is not a 40-hex commit SHA", sha)
	}
	s.mu.Lock()
	repo, ok := s.repos[strings.ToLower(repoFullName)]
	if !ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("githubtest: unknown repository %s", repoFullName)
	}
	before, existed := repo.refs[ref]
	if !existed {
		before = strings.Repeat("0", 40)
	}
	repo.refs[ref] = sha
	base := s.webhookAPIBase()
	repoObj := s.repoJSON(repo, base)
	repoObj["master_branch"] = repo.defaultBranch
	now := timestamp(s.now())
	headCommit := map[string]any{
		"id": sha, "tree_id": syntheticSHA(sha, "tree"), "distinct": true, "message": "release",
		"timestamp": now, "url": s.opts.HTMLURL + "/" + repo.fullName() + "/commit/" + sha,
		"author":    map[string]any{"name": "Release Bot", "email": "release@example.com", "username": "release-bot"},
		"committer": map[string]any{"name": "Release Bot", "email": "release@example.com", "username": "release-bot"},
		"added":     []any{}, "removed": []any{}, "modified": []any{},
	}
	payload := map[string]any{
		"ref": ref, "before": before, "after": sha,
		"created": !existed, "deleted": false, "forced": false, "base_ref": nil,
		"compare":     s.opts.HTMLURL + "/" + repo.fullName() + "/compare/" + before[:12] + "..." + sha[:12],
		"commits":     []any{},
		"head_commit": headCommit,
		"repository":  repoObj,
		"pusher":      map[string]any{"name": "release-bot", "email": "release@example.com"},
		"sender":      map[string]any{"login": "release-bot", "id": 1001, "type": "User"},
		"installation": map[string]any{
			"id": repo.installationID, "node_id": nodeID("I", repo.installationID),
		},
	}
	s.notify()
	s.mu.Unlock()
	return s.DeliverWebhook(ctx, "push", payload)
}

// RerequestCheckRun delivers the check_run "rerequested" webhook GitHub
// sends when someone clicks "Re-run" on check run checkRunID: the user
// release-manager (id 1002). The payload describes the Check Run as it is
// and the user who clicked, nothing of the click itself, so the same user's
// second click on an unchanged Check Run sends the same bytes again.
func (s *Server) RerequestCheckRun(ctx context.Context, checkRunID int64) (*Delivery, error) {
	return s.RerequestCheckRunAs(ctx, checkRunID, "release-manager", 1002)
}

// RerequestCheckRunAs is RerequestCheckRun clicked by the user login (id).
func (s *Server) RerequestCheckRunAs(ctx context.Context, checkRunID int64, login string, id int64) (*Delivery, error) {
	s.mu.Lock()
	i := slices.IndexFunc(s.checkRuns, func(c *CheckRun) bool { return c.ID == checkRunID })
	if i < 0 {
		s.mu.Unlock()
		return nil, fmt.Errorf("githubtest: unknown check run %d", checkRunID)
	}
	cr := s.checkRuns[i]
	repo := s.reposByID[cr.RepositoryID]
	base := s.webhookAPIBase()
	payload := map[string]any{
		"action":       "rerequested",
		"check_run":    s.checkRunJSON(cr, base),
		"repository":   s.repoJSON(repo, base),
		"sender":       map[string]any{"login": login, "id": id, "type": "User"},
		"installation": map[string]any{"id": repo.installationID, "node_id": nodeID("I", repo.installationID)},
	}
	s.mu.Unlock()
	return s.DeliverWebhook(ctx, "check_run", payload)
}

func (s *Server) webhookAPIBase() string {
	if s.ts != nil {
		return s.ts.URL
	}
	return "https://api.github.com"
}

func uuid4() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("githubtest: random source: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:], nil
}
