package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Held is one in-flight lease.
type Held struct {
	// Fence is the lease.
	Fence store.Fence
	// Cancel cancels the delivery; the extender calls it with LostCause
	// when the lease was lost.
	Cancel context.CancelCauseFunc
	// Kept, when set, is called after each extension that kept the lease
	// (a broker consumer tells the broker the message is in progress).
	Kept func()
}

// Leases is the registry of an engine's in-flight leases, keyed by fence
// (effect id and lease token): one engine may hold two deliveries of one
// effect, a stale one whose lease was taken away (requeue-stale, the
// sweeper) and a fresh one of the same effect claimed again, and each is
// extended, or cancelled as lease-lost, on its own.
type Leases struct {
	mu sync.Mutex
	m  map[store.Fence]*Held
}

// Put registers h, replacing the registration of the same fence.
func (l *Leases) Put(h *Held) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[store.Fence]*Held{}
	}
	l.m[h.Fence] = h
	l.mu.Unlock()
}

// Delete forgets the lease fenced by f.
func (l *Leases) Delete(f store.Fence) {
	l.mu.Lock()
	delete(l.m, f)
	l.mu.Unlock()
}

func (l *Leases) snapshot() []*Held {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*Held, 0, len(l.m))
	for _, h := range l.m {
		out = append(out, h)
	}
	return out
}

// Extender extends every lease of Leases in one statement per tick.
type Extender struct {
	// DB runs the extension.
	DB store.DBTX
	// Leases are the leases extended.
	Leases *Leases
	// Lease is the new lease length, from now() on the database clock.
	Lease time.Duration
	// LostCause is the cancellation cause of a delivery whose lease was lost.
	LostCause error
	// Log receives extension failures.
	Log *slog.Logger
}

// Run extends every interval until ctx ends. The end of ctx never cuts an
// extension short (it runs under Outlive).
func (e *Extender) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fctx, cancel := Outlive(ctx)
			e.ExtendNow(fctx)
			cancel()
		}
	}
}

// ExtendNow extends every registered lease now, cancels (with LostCause)
// the deliveries whose lease was lost and calls Kept of the others.
func (e *Extender) ExtendNow(ctx context.Context) {
	held := e.Leases.snapshot()
	if len(held) == 0 {
		return
	}
	fences := make([]store.Fence, len(held))
	for i, h := range held {
		fences[i] = h.Fence
	}
	kept, err := store.Extend(ctx, e.DB, fences, e.Lease)
	if err != nil {
		if ctx.Err() == nil {
			e.Log.Error("lease extension failed", "err", err, "leases", len(fences))
		}
		return
	}
	for _, h := range held {
		switch {
		case !kept[h.Fence]:
			h.Cancel(e.LostCause)
		case h.Kept != nil:
			h.Kept()
		}
	}
}
