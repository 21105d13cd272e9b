// Package lifecycle is the start/stop plumbing shared by the engine's Client
// and the broker adapters (adapters/nats): goroutines in three tiers,
// stopped in order, with a grace period. It holds no engine state and runs
// no statement, so an adapter built on the public API may use it, like
// internal/httpx (see TestApplicationsUseThePublicAPI).
package lifecycle

import (
	"context"
	"errors"
	"sync"
)

// Lifecycle is the start/stop contract of an engine (a Client, a broker
// consumer or relay). Its goroutines come in three tiers, stopped in order:
// run goroutines (claim and pull loops, the listener, maintenance) stop
// first; then deliveries finish, within Stop's grace; then services (the
// lease extender, the group committer) stop, since the deliveries' last
// writes need them.
type Lifecycle struct {
	name string

	mu      sync.Mutex
	started bool
	stopped bool

	run        context.Context
	runCancel  context.CancelFunc
	work       context.Context
	workCancel context.CancelCauseFunc

	runWG      sync.WaitGroup
	deliveries sync.WaitGroup
	after      []func()
}

// New returns a Lifecycle whose errors start with name (e.g.
// "pgoutbox: client").
func New(name string) *Lifecycle { return &Lifecycle{name: name} }

// Start runs fn, which starts the engine's goroutines with Go, Service and
// OnStop. The Lifecycle counts as started only when fn succeeds; a second
// Start fails.
func (l *Lifecycle) Start(fn func() error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return errors.New(l.name + " already started")
	}
	l.run, l.runCancel = context.WithCancel(context.Background())
	l.work, l.workCancel = context.WithCancelCause(context.Background())
	if err := fn(); err != nil {
		l.runCancel()
		l.workCancel(nil)
		l.after = nil
		return err
	}
	l.started = true
	return nil
}

// Go runs fn in a run goroutine: ctx ends when Stop begins, and Stop waits
// for fn to return before it waits for the deliveries.
func (l *Lifecycle) Go(fn func(ctx context.Context)) {
	l.runWG.Add(1)
	go func() {
		defer l.runWG.Done()
		fn(l.run)
	}()
}

// Service runs fn in a goroutine whose ctx ends once the deliveries have
// finished (the lease extender); Stop waits for it.
func (l *Lifecycle) Service(fn func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		fn(ctx)
	}()
	l.after = append(l.after, func() { cancel(); wg.Wait() })
}

// OnStop registers fn to run once the deliveries have finished, after the
// services registered before it (the group committer's Close).
func (l *Lifecycle) OnStop(fn func()) { l.after = append(l.after, fn) }

// Work is the parent context of every delivery: Stop cancels it, with the
// cause it is given, when its grace ends.
func (l *Lifecycle) Work() context.Context { return l.work }

// AddDelivery counts one delivery (or anything Stop must wait for before
// the services stop); DeliveryDone ends it.
func (l *Lifecycle) AddDelivery() { l.deliveries.Add(1) }

// DeliveryDone ends one delivery counted by AddDelivery.
func (l *Lifecycle) DeliveryDone() { l.deliveries.Done() }

// Stop stops the run goroutines, lets the deliveries finish until ctx ends,
// then cancels the rest with cause, and stops the services. It returns when
// every goroutine has exited, with ran true and err ctx.Err() when ctx
// ended first. Stop before Start, and every Stop after the first, does
// nothing and returns false, nil.
func (l *Lifecycle) Stop(ctx context.Context, cause error) (ran bool, err error) {
	l.mu.Lock()
	if !l.started || l.stopped {
		l.mu.Unlock()
		return false, nil
	}
	l.stopped = true
	l.mu.Unlock()

	l.runCancel()
	l.runWG.Wait()
	done := make(chan struct{})
	go func() { l.deliveries.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		l.workCancel(cause)
		<-done
		err = ctx.Err()
	}
	l.workCancel(nil)
	for _, fn := range l.after {
		fn()
	}
	return true, err
}
