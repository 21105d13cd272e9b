package solrtest

import (
	"context"
	"net/http"
	"time"
)

// FaultKind is what an injected fault does to a matching request.
type FaultKind int

// Fault kinds.
const (
	// FaultStatus answers Status (default 503) with Solr's error body and,
	// when RetryAfter is set, a Retry-After header. The request is not
	// processed.
	FaultStatus FaultKind = iota + 1
	// FaultDelay waits Delay (or until the request's context ends, in which
	// case nothing is processed), then handles the request.
	FaultDelay
	// FaultLoseResponse processes the request (the update really happens),
	// then closes the connection without a response.
	FaultLoseResponse
)

// String names the kind.
func (k FaultKind) String() string {
	switch k {
	case 0:
		return "none"
	case FaultStatus:
		return "status"
	case FaultDelay:
		return "delay"
	case FaultLoseResponse:
		return "lose-response"
	}
	return "unknown"
}

// FaultRule programs a fault. A request matches when Handler ("update",
// "get", "select"; "" any) and Method ("" any) match; the first rule with
// uses left applies.
type FaultRule struct {
	Handler string
	Method  string
	// Times is how many requests the rule affects; 0 means every matching
	// request until ClearFaults.
	Times      int
	Kind       FaultKind
	Status     int
	RetryAfter time.Duration
	Delay      time.Duration
}

type faultState struct {
	rule FaultRule
	left int // <0: unlimited
}

// InjectFault adds a rule.
func (s *Server) InjectFault(rule FaultRule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left := rule.Times
	if left <= 0 {
		left = -1
	}
	s.faults = append(s.faults, &faultState{rule: rule, left: left})
}

// ClearFaults removes every rule.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

func (s *Server) takeFault(method, handler string) *FaultRule {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if f.left == 0 || (f.rule.Handler != "" && f.rule.Handler != handler) ||
			(f.rule.Method != "" && f.rule.Method != method) {
			continue
		}
		if f.left > 0 {
			f.left--
		}
		r := f.rule
		return &r
	}
	return nil
}

// Call is one request in the call log: never bodies or credentials.
type Call struct {
	At      time.Time
	Method  string
	Path    string
	Handler string // "update", "get", "select"
	// Status is the answer's status; 0 when the response was lost.
	Status int
	Fault  FaultKind
	// Docs is the number of documents an update added.
	Docs int
}

type callKey struct{}

func (s *Server) beginCall(c Call) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
	return len(s.calls) - 1
}

func (s *Server) endCall(i, status int, fault FaultKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[i].Status, s.calls[i].Fault = status, fault
	s.notifyLocked()
}

// recordDocsLocked notes how many documents the request's update added.
func (s *Server) recordDocsLocked(r *http.Request, n int) {
	if i, ok := r.Context().Value(callKey{}).(int); ok && i < len(s.calls) {
		s.calls[i].Docs = n
	}
}

// Calls returns the call log.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Doc returns the real-time document of id in core (what /get sees), or
// nil. Multi-document ids (overwrite=false) return the last one.
func (s *Server) Doc(core, id string) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cores[core]
	if c == nil || len(c.live[id]) == 0 {
		return nil
	}
	d := c.live[id][len(c.live[id])-1]
	out := make(map[string]any, len(d))
	for k, v := range d {
		out[k] = v
	}
	return out
}

// Count returns the number of real-time documents in core (an id stored
// twice with overwrite=false counts twice).
func (s *Server) Count(core string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	if c := s.cores[core]; c != nil {
		for _, ds := range c.live {
			n += len(ds)
		}
	}
	return n
}

// Commit makes every pending update of core visible to searches.
func (s *Server) Commit(core string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cores[core]; c != nil {
		s.applyDueLocked(c, true)
		s.notifyLocked()
	}
}

// Wait blocks until cond holds (checked now and after every request) or ctx
// ends.
func (s *Server) Wait(ctx context.Context, cond func(*Server) bool) error {
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond(s) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
