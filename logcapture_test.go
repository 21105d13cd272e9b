package pgoutbox_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// logCapture is a slog.Handler that keeps every record (all levels) and
// lets a test wait for a record matching a predicate.
type logCapture struct {
	mu      sync.Mutex
	recs    []slog.Record
	changed chan struct{} // closed and replaced on every record
}

func newLogCapture() *logCapture { return &logCapture{changed: make(chan struct{})} }

func (l *logCapture) Logger() *slog.Logger { return slog.New(l) }

func (l *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCapture) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCapture) WithGroup(string) slog.Handler            { return l }

func (l *logCapture) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	close(l.changed)
	l.changed = make(chan struct{})
	return nil
}

// attr returns the value of attribute key of r ("" when absent).
func attr(r slog.Record, key string) slog.Value {
	var v slog.Value
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// matching returns the records for which match holds, in order.
func (l *logCapture) matching(match func(slog.Record) bool) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if match(r) {
			out = append(out, r)
		}
	}
	return out
}

// waitCount waits until at least n records match, and returns them; it fails
// the test when ctx ends first.
func (l *logCapture) waitCount(t *testing.T, ctx context.Context, what string, n int, match func(slog.Record) bool) []slog.Record {
	t.Helper()
	for {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		if got := l.matching(match); len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %d log records: %s (have %d)", n, what, len(l.matching(match)))
		}
	}
}

// msg matches records with message m (and, when queue is set, that queue).
func msg(m, queue string) func(slog.Record) bool {
	return func(r slog.Record) bool {
		return r.Message == m && (queue == "" || attr(r, "queue").String() == queue)
	}
}
