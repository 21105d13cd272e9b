package githubtest

import (
	"fmt"
	"net/http"
	"path"
	"time"
)

// FaultKind is what an injected fault does to a matching request.
type FaultKind int

// Fault kinds.
const (
	// FaultStatus answers FaultRule.Status (default 500) with FaultRule.Body
	// (default GitHub's error body for the status) and, when
	// FaultRule.RetryAfter is set, a Retry-After header. The request is not
	// processed unless FaultRule.Process is set.
	FaultStatus FaultKind = iota + 1
	// FaultSecondaryRateLimit answers GitHub's secondary-rate-limit error:
	// FaultRule.Status (default 429; 403 is the other status GitHub uses)
	// with Retry-After (FaultRule.RetryAfter, default 60 s). Not processed
	// unless FaultRule.Process is set.
	FaultSecondaryRateLimit
	// FaultLoseResponse processes the request (the check run or the dispatch
	// really happens), then closes the connection without a response.
	FaultLoseResponse
	// FaultResetBeforeProcessing closes the connection without processing
	// the request or answering.
	FaultResetBeforeProcessing
	// FaultDelay waits FaultRule.Delay (or until the request's context is
	// done, in which case nothing is processed), then handles the request
	// normally.
	FaultDelay
	// FaultMalformedBody processes the request, then answers a 2xx status
	// (the real one, or 200 instead of 204 or an error) with a truncated,
	// unparsable JSON body.
	FaultMalformedBody
)

// String returns the kind's name.
func (k FaultKind) String() string {
	switch k {
	case 0:
		return "none"
	case FaultStatus:
		return "status"
	case FaultSecondaryRateLimit:
		return "secondary-rate-limit"
	case FaultLoseResponse:
		return "lose-response"
	case FaultResetBeforeProcessing:
		return "reset-before-processing"
	case FaultDelay:
		return "delay"
	case FaultMalformedBody:
		return "malformed-body"
	default:
		return fmt.Sprintf("FaultKind(%d)", int(k))
	}
}

// FaultRule programs a fault. A request matches when every non-empty
// matcher (Route, Method, Path) matches; the first matching rule with
// remaining uses applies, and only one rule applies per request.
type FaultRule struct {
	// Route is a Route* constant (GitHub's operation id); "" matches any.
	Route string
	// Method is an HTTP method; "" matches any.
	Method string
	// Path is a path.Match pattern on the URL path, e.g.
	// "/repos/acme/*/check-runs"; "" matches any.
	Path string
	// Times is how many matching requests the rule affects; 0 or less means
	// every matching request until ClearFaults.
	Times int
	// Kind is what the fault does.
	Kind FaultKind
	// Status is the status of FaultStatus and FaultSecondaryRateLimit.
	Status int
	// Body replaces the default JSON error body of FaultStatus; it is sent
	// as is, as application/json when it is valid JSON and as text/html
	// otherwise (like the HTML pages of GitHub's load balancers).
	Body string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up) by FaultStatus and FaultSecondaryRateLimit.
	RetryAfter time.Duration
	// Delay is FaultDelay's wait.
	Delay time.Duration
	// Process makes FaultStatus and FaultSecondaryRateLimit process the
	// request before answering the fault (e.g. a 502 after the dispatch
	// happened).
	Process bool
}

type faultState struct {
	FaultRule
	remaining int // < 0: unlimited
}

// InjectFault adds rule after the rules already injected.
func (s *Server) InjectFault(rule FaultRule) {
	remaining := rule.Times
	if remaining <= 0 {
		remaining = -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &faultState{FaultRule: rule, remaining: remaining})
}

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// takeFault returns (and uses once) the first rule matching the request.
func (s *Server) takeFault(method, route, urlPath string) *FaultRule {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if f.remaining == 0 ||
			(f.Route != "" && f.Route != route) ||
			(f.Method != "" && f.Method != method) {
			continue
		}
		if f.Path != "" {
			if ok, err := path.Match(f.Path, urlPath); err != nil || !ok {
				continue
			}
		}
		rule := f.FaultRule
		if f.remaining > 0 {
			f.remaining--
			if f.remaining == 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
		}
		return &rule
	}
	return nil
}

// faultReply renders a FaultStatus or FaultSecondaryRateLimit rule.
func (s *Server) faultReply(f *FaultRule, p principal) reply {
	var rep reply
	if f.Kind == FaultSecondaryRateLimit {
		status := f.Status
		if status == 0 {
			status = http.StatusTooManyRequests
		}
		retry := f.RetryAfter
		if retry <= 0 {
			retry = time.Minute
		}
		rep = errorReply(status, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach out to GitHub Support for help, please include the request ID.", docSecondary)
		rep.header = http.Header{"Retry-After": {retryAfterSeconds(retry)}}
		return rep
	}
	status := f.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	message := http.StatusText(status)
	if status >= 500 && status != http.StatusServiceUnavailable {
		message = "Server Error"
	}
	rep = errorReply(status, message, docRoot)
	if f.Body != "" {
		rep.body, rep.raw = nil, []byte(f.Body)
	}
	if f.RetryAfter > 0 {
		rep.header = http.Header{"Retry-After": {retryAfterSeconds(f.RetryAfter)}}
	}
	return rep
}

// Call is one entry of the call log.
type Call struct {
	// Seq numbers calls in arrival order, from 1.
	Seq int
	// Method and Path are the request's method and URL path; Query its raw
	// query.
	Method, Path, Query string
	// Route is the Route* constant that matched.
	Route string
	// At is the arrival time (Options.Clock).
	At time.Time
	// Status is the status answered; 0 when no response was sent (a lost
	// response, a reset, or the client gave up during a delay) or the call is
	// still being handled.
	Status int
	// Fault is the fault applied to the call, 0 for none.
	Fault FaultKind
	// InstallationID is the installation whose token authenticated the call.
	InstallationID int64
	// Done is false while the call is being handled.
	Done bool
}

func (s *Server) beginCall(r *http.Request, route string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, Call{
		Seq: len(s.calls) + 1, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		Route: route, At: s.now(),
	})
	s.notify()
	return len(s.calls) - 1
}

func (s *Server) endCall(i, status int, fault FaultKind, installationID int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.calls[i]
	c.Status, c.Fault, c.InstallationID, c.Done = status, fault, installationID, true
	s.notify()
}
