package main

import (
	"math"
	"testing"
	"time"
)

// samples builds 1-second intervals from phases and completions, with
// backlogs.
func samples(phases string, completed []int64, backlog []int64) []xminSample {
	names := map[byte]string{'c': phaseClean, 'h': phaseHeld, 'a': phaseAfter}
	var out []xminSample
	for i := range phases {
		s := xminSample{T: float64(i + 1), Seconds: 1, Phase: names[phases[i]], Completed: completed[i], Rate: float64(completed[i])}
		if backlog != nil {
			s.Backlog = backlog[i]
		}
		out = append(out, s)
	}
	return out
}

func TestPhaseDueFollowsTheFlags(t *testing.T) {
	x := &xminOptions{clean: time.Minute, hold: 2 * time.Minute, after: 5 * time.Minute}
	for _, c := range []struct {
		phase string
		in    time.Duration
		want  bool
	}{
		{phaseClean, 59 * time.Second, false},
		{phaseClean, time.Minute, true},
		{phaseHeld, time.Minute, false},
		{phaseHeld, 2 * time.Minute, true},
		{phaseAfter, 4 * time.Minute, false},
		{phaseAfter, 5 * time.Minute, true},
	} {
		if got := phaseDue(c.phase, c.in, x); got != c.want {
			t.Errorf("phaseDue(%s, %s) = %v, want %v", c.phase, c.in, got, c.want)
		}
	}
}

// The rate of a phase is its completions over its seconds, the skipped
// first intervals left out; the other phases do not count.
func TestPhaseRateSplitsByPhase(t *testing.T) {
	s := samples("ccchhaa", []int64{10, 100, 100, 50, 70, 200, 100}, nil)
	if got := phaseRate(s, phaseClean, 1); got != 100 {
		t.Errorf("clean rate = %v, want 100", got)
	}
	if got := phaseRate(s, phaseClean, 0); got != 70 {
		t.Errorf("clean rate without skipping = %v, want 70", got)
	}
	if got := phaseRate(s, phaseHeld, 0); got != 60 {
		t.Errorf("held rate = %v, want 60", got)
	}
	if got := minRate(s, phaseHeld, 1); got != 50 {
		t.Errorf("worst held interval = %v, want 50", got)
	}
	s[3].Seconds = 0.1 // a short interval does not count
	if got := minRate(s, phaseHeld, 0.5); got != 70 {
		t.Errorf("worst held interval of at least 0.5 s = %v, want 70", got)
	}
	s[3].Seconds = 1
	if got := ratio(phaseRate(s, phaseHeld, 0), phaseRate(s, phaseClean, 1)); got != 0.6 {
		t.Errorf("held / clean = %v, want 0.6", got)
	}
	if got := phaseRate(s[:3], phaseHeld, 0); !math.IsNaN(got) {
		t.Errorf("rate of a phase without intervals = %v, want NaN", got)
	}
	if got := ratio(1, 0); !math.IsNaN(got) {
		t.Errorf("ratio(1, 0) = %v, want NaN", got)
	}
}

func TestRecoveryCountsFromTheHoldsEnd(t *testing.T) {
	// Hold ends at t=4; intervals after it start at 4, 5, 6, 7.
	for _, c := range []struct {
		name      string
		completed []int64
		want      float64
		ok        bool
	}{
		{"at once", []int64{100, 100, 100, 40, 95, 100, 100, 100}, 0, true},
		{"after two slow intervals", []int64{100, 100, 100, 40, 50, 60, 95, 100}, 2, true},
		// One good interval followed by a slow one is not a recovery.
		{"a single good interval", []int64{100, 100, 100, 40, 95, 50, 95, 95}, 2, true},
		{"the last interval alone", []int64{100, 100, 100, 40, 50, 50, 50, 95}, 3, true},
		{"never", []int64{100, 100, 100, 40, 50, 50, 50, 50}, math.NaN(), false},
	} {
		got, ok := recovery(samples("cchhaaaa", c.completed, nil), 90, 2)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("%s: recovery = %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if _, ok := recovery(samples("cchh", []int64{1, 1, 1, 1}, nil), 0, 2); ok {
		t.Error("recovery without a phase after the hold reported one")
	}
}

func TestCatchUpWaitsForTheCleanBacklog(t *testing.T) {
	s := samples("chhaaa", []int64{1, 1, 1, 1, 1, 1}, []int64{100, 500, 900, 600, 150, 100})
	if got, ok := catchUp(s, 200); !ok || got != 2 {
		t.Errorf("catchUp = %v, %v; want 2, true", got, ok)
	}
	if got, ok := catchUp(s, 900); !ok || got != 0 {
		t.Errorf("catchUp with the hold's end already under the limit = %v, %v; want 0, true", got, ok)
	}
	if _, ok := catchUp(s, 50); ok {
		t.Error("catchUp reported a backlog that never came down")
	}
	if got := maxBacklog(s, phaseHeld); got != 900 {
		t.Errorf("maxBacklog(held) = %d, want 900", got)
	}
}

func TestBacklogSpreadIsLargestOverSmallest(t *testing.T) {
	if got := lastOverFirst([]float64{40000, 36000, 30000}); got != 0.75 {
		t.Errorf("lastOverFirst = %v, want 0.75", got)
	}
	for _, ys := range [][]float64{{1}, {math.NaN(), 2}, {0, 2}} {
		if got := lastOverFirst(ys); !math.IsNaN(got) {
			t.Errorf("lastOverFirst(%v) = %v, want NaN", ys, got)
		}
	}
}
