package githubtest

import (
	"context"
	"maps"
	"slices"
)

// Snapshot is a copy of the emulator's observable state.
type Snapshot struct {
	// CheckRuns in creation order.
	CheckRuns []CheckRun
	// Dispatches in acceptance order.
	Dispatches []Dispatch
	// WorkflowRuns in creation order.
	WorkflowRuns []WorkflowRun
	// Calls in arrival order.
	Calls []Call
	// Deliveries in sending order.
	Deliveries []Delivery
}

// Snapshot returns a copy of the state.
func (s *Server) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshotLocked()
}

func (s *Server) snapshotLocked() Snapshot {
	snap := Snapshot{
		CheckRuns:    make([]CheckRun, len(s.checkRuns)),
		Dispatches:   make([]Dispatch, len(s.dispatches)),
		WorkflowRuns: make([]WorkflowRun, len(s.runs)),
		Calls:        slices.Clone(s.calls),
		Deliveries:   make([]Delivery, len(s.deliveries)),
	}
	for i, cr := range s.checkRuns {
		snap.CheckRuns[i] = *cr
	}
	for i, d := range s.dispatches {
		d.Inputs = maps.Clone(d.Inputs)
		snap.Dispatches[i] = d
	}
	for i, run := range s.runs {
		r := *run
		r.Inputs = maps.Clone(run.Inputs)
		snap.WorkflowRuns[i] = r
	}
	for i, d := range s.deliveries {
		d.Body = slices.Clone(d.Body)
		d.Header = d.Header.Clone()
		d.ResponseBody = slices.Clone(d.ResponseBody)
		snap.Deliveries[i] = d
	}
	return snap
}

// CheckRuns returns copies of every check run, in creation order.
func (s *Server) CheckRuns() []CheckRun { return s.Snapshot().CheckRuns }

// Dispatches returns every accepted workflow dispatch, in order.
func (s *Server) Dispatches() []Dispatch { return s.Snapshot().Dispatches }

// WorkflowRuns returns copies of every workflow run, in creation order.
func (s *Server) WorkflowRuns() []WorkflowRun { return s.Snapshot().WorkflowRuns }

// Calls returns the call log, in arrival order.
func (s *Server) Calls() []Call { return s.Snapshot().Calls }

// Deliveries returns every webhook delivery, in sending order.
func (s *Server) Deliveries() []Delivery { return s.Snapshot().Deliveries }

// Wait blocks until cond holds for the state or ctx is done, and returns
// ctx's error in the latter case. cond is called on the caller's goroutine
// with a fresh Snapshot, first at once and then after every state change (a
// request arriving or finishing, a check run, a dispatch, a delivery…).
func (s *Server) Wait(ctx context.Context, cond func(Snapshot) bool) error {
	for {
		s.mu.Lock()
		snap := s.snapshotLocked()
		changed := s.changed
		s.mu.Unlock()
		if cond(snap) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
