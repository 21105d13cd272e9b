package githubtest_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

type received struct {
	header     http.Header
	normalized webhook.Normalized
}

// receiver is a webhook endpoint that verifies and normalizes what it gets.
type receiver struct {
	secret []byte
	mu     sync.Mutex
	got    []received
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if err := webhook.Verify(rc.secret, body, r.Header.Get(webhook.SignatureHeader)); err != nil {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	n, err := webhook.Normalize(r.Header.Get(webhook.EventHeader), body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	rc.got = append(rc.got, received{header: r.Header.Clone(), normalized: n})
	rc.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

func (rc *receiver) all() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// setupWebhook starts a receiver that verifies with "webhook-secret" and an
// emulator that signs with signingSecret.
func setupWebhook(t *testing.T, signingSecret []byte) (bundle, *receiver) {
	t.Helper()
	rc := &receiver{secret: []byte("webhook-secret")}
	hook := httptest.NewServer(rc)
	t.Cleanup(hook.Close)
	return setup(t, fakegh.Options{WebhookURL: hook.URL, WebhookSecret: signingSecret}), rc
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestCompleteRunDeliversSignedWebhook(t *testing.T) {
	t.Parallel()
	b, rc := setupWebhook(t, []byte("webhook-secret"))
	r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "refs/tags/v1.0.0", "inputs": releaseInputs(12, 3), "return_run_details": true})
	var details struct {
		ID int64 `json:"workflow_run_id"`
	}
	r.decode(t, &details)

	d, err := b.srv.CompleteRun(t.Context(), details.ID, "success")
	must(t, err)
	if d == nil || d.StatusCode != http.StatusAccepted || d.Event != "workflow_run" || d.Action != "completed" || !uuidPattern.MatchString(d.ID) {
		t.Fatalf("delivery = %+v", d)
	}
	got := rc.all()
	if len(got) != 1 {
		t.Fatalf("%d deliveries received", len(got))
	}
	h := got[0].header
	if h.Get("X-GitHub-Event") != "workflow_run" || h.Get("X-GitHub-Delivery") != d.ID || h.Get("Content-Type") != "application/json" ||
		h.Get("X-Hub-Signature") == "" || h.Get("X-GitHub-Hook-Installation-Target-Type") != "integration" {
		t.Errorf("headers = %v", h)
	}
	n := got[0].normalized
	wr := n.WorkflowRun
	if n.Action != "completed" || n.InstallationID != installationID || n.RepositoryID != 1001 || n.RepositoryFullName != repoName ||
		wr == nil || wr.ID != details.ID || wr.Conclusion != "success" || wr.Status != "completed" ||
		wr.DisplayTitle != "release 12 attempt 3" || wr.HeadBranch != "v1.0.0" || wr.RunAttempt != 1 ||
		wr.Path != ".github/workflows/release.yml" || wr.TriggerEvent != "workflow_dispatch" {
		t.Fatalf("normalized = %+v / %+v", n, wr)
	}
	if runs := b.srv.WorkflowRuns(); runs[0].Status != "completed" || runs[0].Conclusion != "success" {
		t.Fatalf("run = %+v", runs[0])
	}
	if _, err := b.srv.CompleteRun(t.Context(), details.ID, "success"); err == nil {
		t.Fatal("completing a completed run succeeded")
	}

	// A redelivery repeats the GUID and the body.
	again, err := b.srv.Redeliver(t.Context(), d.ID)
	must(t, err)
	if again.ID != d.ID || string(again.Body) != string(d.Body) || !again.Redelivery {
		t.Fatalf("redelivery = %+v", again)
	}
	if got := rc.all(); len(got) != 2 || got[1].header.Get("X-GitHub-Delivery") != d.ID {
		t.Fatalf("redelivery not received: %d", len(got))
	}
	if n := len(b.srv.Deliveries()); n != 2 {
		t.Fatalf("%d deliveries recorded", n)
	}
}

func TestPushAndRerequestWebhooks(t *testing.T) {
	t.Parallel()
	b, rc := setupWebhook(t, []byte("webhook-secret"))
	_, err := b.srv.Push(t.Context(), repoName, "refs/tags/v2.0.0", sha)
	must(t, err)
	r := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "BoardReadyOps release", "head_sha": sha, "external_id": "77"})
	var cr struct {
		ID int64 `json:"id"`
	}
	r.decode(t, &cr)
	_, err = b.srv.RerequestCheckRun(t.Context(), cr.ID)
	must(t, err)

	got := rc.all()
	if len(got) != 2 {
		t.Fatalf("%d deliveries", len(got))
	}
	push := got[0].normalized
	if push.Event != "push" || push.InstallationID != installationID || push.RepositoryID != 1001 ||
		push.Push.Ref != "refs/tags/v2.0.0" || push.Push.After != sha || !push.Push.Created || push.Push.Before != "0000000000000000000000000000000000000000" ||
		push.Push.DefaultBranch != "main" {
		t.Fatalf("push = %+v / %+v", push, push.Push)
	}
	rerun := got[1].normalized
	if rerun.Event != "check_run" || rerun.Action != "rerequested" || rerun.CheckRun.ID != cr.ID || rerun.CheckRun.ExternalID != "77" ||
		rerun.CheckRun.AppID != 1 || rerun.InstallationID != installationID {
		t.Fatalf("check_run = %+v / %+v", rerun, rerun.CheckRun)
	}
	// The tag now resolves to the pushed commit.
	if l := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/v2.0.0/check-runs", b.token, nil); l.status != 200 || !regexp.MustCompile(`"id":`+strconv.FormatInt(cr.ID, 10)).Match(l.body) {
		t.Fatalf("check runs for the pushed tag: %s", l.body)
	}
}

func TestRejectedDeliveryIsAnError(t *testing.T) {
	t.Parallel()
	b, rc := setupWebhook(t, []byte("a-different-secret"))
	r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1), "return_run_details": true})
	var details struct {
		ID int64 `json:"workflow_run_id"`
	}
	r.decode(t, &details)
	d, err := b.srv.CompleteRun(t.Context(), details.ID, "failure")
	if !errors.Is(err, fakegh.ErrDeliveryRejected) || d == nil || d.StatusCode != http.StatusUnauthorized {
		t.Fatalf("CompleteRun = %+v, %v", d, err)
	}
	if len(rc.all()) != 0 {
		t.Fatal("the receiver accepted a badly signed delivery")
	}
}

func TestNoWebhookConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1), "return_run_details": true})
	var details struct {
		ID int64 `json:"workflow_run_id"`
	}
	r.decode(t, &details)
	_, err := b.srv.StartRun(t.Context(), details.ID)
	must(t, err)
	d, err := b.srv.CompleteRun(t.Context(), details.ID, "cancelled")
	if err != nil || d != nil {
		t.Fatalf("CompleteRun = %+v, %v", d, err)
	}
	if runs := b.srv.WorkflowRuns(); runs[0].Conclusion != "cancelled" {
		t.Fatalf("run = %+v", runs[0])
	}
	if _, err := b.srv.CompleteRun(t.Context(), 42, "success"); err == nil {
		t.Fatal("completing an unknown run succeeded")
	}
	if _, err := b.srv.CompleteRun(t.Context(), details.ID, "great"); err == nil {
		t.Fatal("an invalid conclusion was accepted")
	}
}

func TestDeliverEveryCorpusPayload(t *testing.T) {
	t.Parallel()
	b, rc := setupWebhook(t, []byte("webhook-secret"))
	payloads, err := fakegh.Payloads()
	must(t, err)
	if len(payloads) < 100 {
		t.Fatalf("%d payloads", len(payloads))
	}
	for _, p := range payloads {
		d, err := b.srv.DeliverWebhook(t.Context(), p.Event, p.Body)
		if err != nil {
			t.Fatalf("%s/%s: %v", p.Event, p.Name, err)
		}
		if string(d.Body) != string(p.Body) {
			t.Fatalf("%s/%s: the body was re-encoded", p.Event, p.Name)
		}
	}
	if got := rc.all(); len(got) != len(payloads) || got[0].normalized.Event != payloads[0].Event {
		t.Fatalf("received %d of %d", len(got), len(payloads))
	}
}
