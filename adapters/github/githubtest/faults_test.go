package githubtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

func TestLoseResponseStillProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Times: 1, Kind: fakegh.FaultLoseResponse})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Method: http.MethodPost, Times: 1, Kind: fakegh.FaultLoseResponse})

	_, err := b.send(t.Context(), http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1), "return_run_details": true})
	if err == nil {
		t.Fatal("the dispatch got a response")
	}
	if _, err := b.send(t.Context(), http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha}); err == nil {
		t.Fatal("the check run creation got a response")
	}
	if d := b.srv.Dispatches(); len(d) != 1 || d[0].Inputs["release_run_id"] != "1" {
		t.Fatalf("dispatches = %+v, want the lost one processed", d)
	}
	if n := len(b.srv.CheckRuns()); n != 1 {
		t.Fatalf("%d check runs, want the lost one processed", n)
	}
	calls := b.srv.Calls()
	last := calls[len(calls)-1]
	if last.Status != 0 || last.Fault != fakegh.FaultLoseResponse || last.Route != fakegh.RouteCreateCheckRun || !last.Done {
		t.Fatalf("last call = %+v", last)
	}
	// Times: 1 — the next dispatch is answered.
	if r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 2)}); r.status != http.StatusNoContent {
		t.Fatalf("after the fault: HTTP %d", r.status)
	}
}

func TestResetBeforeProcessing(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Path: "/repos/acme/*/actions/workflows/*/dispatches", Times: 1, Kind: fakegh.FaultResetBeforeProcessing})
	if _, err := b.send(t.Context(), http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1)}); err == nil {
		t.Fatal("got a response")
	}
	if n := len(b.srv.Dispatches()); n != 0 {
		t.Fatalf("%d dispatches, want none", n)
	}
}

func TestMalformedBodyAfterProcessing(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Kind: fakegh.FaultMalformedBody})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Kind: fakegh.FaultMalformedBody})
	for _, body := range []map[string]any{
		{"ref": "main", "inputs": releaseInputs(1, 1), "return_run_details": true},
		{"ref": "main", "inputs": releaseInputs(1, 2)}, // 204 becomes a 200 with a broken body
	} {
		r := b.do(t, http.MethodPost, dispatchPath, b.token, body)
		if r.status < 200 || r.status > 299 || json.Valid(r.body) || len(r.body) == 0 {
			t.Fatalf("HTTP %d %q, want a 2xx with invalid JSON", r.status, r.body)
		}
	}
	r := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha})
	if r.status != http.StatusCreated || json.Valid(r.body) {
		t.Fatalf("check run: HTTP %d %q", r.status, r.body)
	}
	if len(b.srv.Dispatches()) != 2 || len(b.srv.CheckRuns()) != 1 {
		t.Fatal("malformed responses were not processed")
	}
}

func TestStatusFaults(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Times: 1, Kind: fakegh.FaultStatus, Status: 502, Process: true})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Times: 1, Kind: fakegh.FaultStatus, Status: 503, RetryAfter: 1500 * time.Millisecond})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Times: 1, Kind: fakegh.FaultStatus, Status: 502, Body: "<html>502 Bad Gateway</html>"})

	r := b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1)})
	if r.status != 502 || r.message(t) != "Server Error" || len(b.srv.Dispatches()) != 1 {
		t.Fatalf("502 after processing: HTTP %d %s, %d dispatches", r.status, r.body, len(b.srv.Dispatches()))
	}
	r = b.do(t, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 2)})
	if r.status != 503 || r.header.Get("Retry-After") != "2" || len(b.srv.Dispatches()) != 1 {
		t.Fatalf("503 before processing: HTTP %d Retry-After %q, %d dispatches", r.status, r.header.Get("Retry-After"), len(b.srv.Dispatches()))
	}
	r = b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha})
	if r.status != 502 || string(r.body) != "<html>502 Bad Gateway</html>" || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
		t.Fatalf("raw body: HTTP %d %q %q", r.status, r.body, r.header.Get("Content-Type"))
	}
	if len(b.srv.CheckRuns()) != 0 {
		t.Fatal("a faulted check run was created")
	}
}

func TestDelayHonoursCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteDispatchWorkflow, Kind: fakegh.FaultDelay, Delay: time.Hour})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err := b.send(ctx, http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(1, 1)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
	waitFor(t, b.srv, "the delayed call to end", func(s fakegh.Snapshot) bool {
		last := s.Calls[len(s.Calls)-1]
		return last.Route == fakegh.RouteDispatchWorkflow && last.Done
	})
	calls := b.srv.Calls()
	if last := calls[len(calls)-1]; last.Status != 0 || last.Fault != fakegh.FaultDelay {
		t.Fatalf("call = %+v", last)
	}
	if n := len(b.srv.Dispatches()); n != 0 {
		t.Fatalf("%d dispatches after the client gave up", n)
	}
}

func TestGlobalDelay(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.SetDelay(time.Hour)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.send(ctx, http.MethodGet, "/repos/acme/widgets/commits/main/check-runs", b.token, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
	b.srv.SetDelay(0)
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/main/check-runs", b.token, nil); r.status != http.StatusOK {
		t.Fatalf("HTTP %d", r.status)
	}
}

func TestRateLimitHeadersAndPrimaryLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{RateLimit: 3})
	const list = "/repos/acme/widgets/commits/main/check-runs"
	reset := b.clock.Now().Add(time.Hour).Unix()

	for i := 1; i <= 3; i++ {
		r := b.do(t, http.MethodGet, list, b.token, nil)
		if r.status != http.StatusOK {
			t.Fatalf("request %d: HTTP %d", i, r.status)
		}
		want := map[string]string{
			"X-Ratelimit-Limit": "3", "X-Ratelimit-Remaining": strconv.Itoa(3 - i), "X-Ratelimit-Used": strconv.Itoa(i),
			"X-Ratelimit-Reset": strconv.FormatInt(reset, 10), "X-Ratelimit-Resource": "core",
		}
		for k, v := range want {
			if got := r.header.Get(k); got != v {
				t.Errorf("request %d: %s = %q, want %q", i, k, got, v)
			}
		}
		if r.header.Get("X-GitHub-Request-Id") == "" || r.header.Get("Date") != b.clock.Now().Format(http.TimeFormat) {
			t.Errorf("request %d: request id %q, date %q", i, r.header.Get("X-GitHub-Request-Id"), r.header.Get("Date"))
		}
	}
	r := b.do(t, http.MethodGet, list, b.token, nil)
	if r.status != http.StatusForbidden || r.header.Get("X-Ratelimit-Remaining") != "0" ||
		!strings.HasPrefix(r.message(t), "API rate limit exceeded for installation ID 100.") {
		t.Fatalf("exhausted: HTTP %d remaining %q %s", r.status, r.header.Get("X-Ratelimit-Remaining"), r.body)
	}
	// Another installation has its own quota.
	tok, _, err := b.srv.IssueToken(otherInstID)
	must(t, err)
	if r := b.do(t, http.MethodGet, "/repos/rival/gadgets/commits/main/check-runs", tok, nil); r.status != http.StatusOK {
		t.Fatalf("other installation: HTTP %d", r.status)
	}
	// The window renews at x-ratelimit-reset.
	b.clock.Advance(time.Hour)
	if r := b.do(t, http.MethodGet, list, mustToken(t, b.srv, installationID), nil); r.status != http.StatusOK || r.header.Get("X-Ratelimit-Remaining") != "2" {
		t.Fatalf("after reset: HTTP %d remaining %q", r.status, r.header.Get("X-Ratelimit-Remaining"))
	}
	// SetRateLimit drives a quota to zero.
	b.srv.SetRateLimit(installationID, 0, time.Time{})
	if r := b.do(t, http.MethodGet, list, mustToken(t, b.srv, installationID), nil); r.status != http.StatusForbidden {
		t.Fatalf("after SetRateLimit: HTTP %d", r.status)
	}
	// Error answers carry the headers too.
	if r := b.do(t, http.MethodGet, list, "", nil); r.header.Get("X-Ratelimit-Limit") != "60" || r.header.Get("X-GitHub-Request-Id") == "" {
		t.Fatalf("401 headers: %v", r.header)
	}
}

func TestSecondaryRateLimitAndCallLog(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Times: 1, Kind: fakegh.FaultSecondaryRateLimit, RetryAfter: 30 * time.Second})
	b.srv.InjectFault(fakegh.FaultRule{Route: fakegh.RouteCreateCheckRun, Times: 1, Kind: fakegh.FaultSecondaryRateLimit, Status: http.StatusForbidden})

	r := b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "30" ||
		!strings.HasPrefix(r.message(t), "You have exceeded a secondary rate limit") || r.header.Get("X-Ratelimit-Remaining") == "0" {
		t.Fatalf("HTTP %d %v %s", r.status, r.header, r.body)
	}
	first := b.clock.Now()
	b.clock.Advance(30 * time.Second)
	r = b.do(t, http.MethodPost, "/repos/acme/widgets/check-runs", b.token, map[string]any{"name": "x", "head_sha": sha})
	if r.status != http.StatusForbidden || r.header.Get("Retry-After") != "60" {
		t.Fatalf("403 variant: HTTP %d Retry-After %q", r.status, r.header.Get("Retry-After"))
	}
	if len(b.srv.CheckRuns()) != 0 {
		t.Fatal("a rate-limited request was processed")
	}
	var creates []fakegh.Call
	for _, c := range b.srv.Calls() {
		if c.Route == fakegh.RouteCreateCheckRun {
			creates = append(creates, c)
		}
	}
	if len(creates) != 2 || creates[0].Status != 429 || !creates[0].At.Equal(first) ||
		creates[1].At.Sub(creates[0].At) != 30*time.Second || creates[0].Fault != fakegh.FaultSecondaryRateLimit ||
		creates[0].InstallationID != installationID || creates[0].Method != http.MethodPost {
		t.Fatalf("call log = %+v", creates)
	}
}

func TestAPIVersionChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	req, err := http.NewRequest(http.MethodGet, b.srv.URL()+"/repos/acme/widgets/commits/main/check-runs", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+b.token)
	req.Header.Set("X-GitHub-Api-Version", "1999-01-01")
	resp, err := b.srv.Client().Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("HTTP %d, want 400", resp.StatusCode)
	}
}

func TestWaitSeesConcurrentDispatch(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	done := make(chan error, 1)
	go func() {
		_, err := b.send(context.Background(), http.MethodPost, dispatchPath, b.token, map[string]any{"ref": "main", "inputs": releaseInputs(3, 1)})
		done <- err
	}()
	waitFor(t, b.srv, "one dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 1 })
	must(t, <-done)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := b.srv.Wait(ctx, func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 2 }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait on a cancelled context = %v", err)
	}
}

func TestClearFaultsAndInvalidOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	b.srv.InjectFault(fakegh.FaultRule{Kind: fakegh.FaultStatus, Status: 500})
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/runs", b.token, nil); r.status != 500 {
		t.Fatalf("with the fault: HTTP %d", r.status)
	}
	b.srv.ClearFaults()
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/actions/runs", b.token, nil); r.status != 200 {
		t.Fatalf("after ClearFaults: HTTP %d", r.status)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted a webhook URL without a secret")
		}
	}()
	fakegh.New(fakegh.Options{WebhookURL: "http://127.0.0.1:1/hook"})
}
