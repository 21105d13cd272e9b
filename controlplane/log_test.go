package controlplane_test

import (
	"bytes"
	"log/slog"
	"sync"
)

// lockedBuffer is a log sink shared by goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

var logLocks sync.Map

func newLogger(buf *bytes.Buffer) *slog.Logger {
	lb, _ := logLocks.LoadOrStore(buf, &lockedBuffer{buf: buf})
	return slog.New(slog.NewTextHandler(lb.(*lockedBuffer), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// logText returns everything logged so far.
func (b *bundle) logText() string {
	lb, _ := logLocks.LoadOrStore(b.logs, &lockedBuffer{buf: b.logs})
	l := lb.(*lockedBuffer)
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
