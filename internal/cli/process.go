package cli

import (
	"context"
	"os/signal"
	"syscall"

	"github.com/pgoutbox/pgoutbox"
)

// processHooks are what serve and work add to the process set-up they
// share (runProcess). Every hook is optional.
type processHooks struct {
	// configure runs once the engine is open, before the client is built,
	// and may change e.cfg (work's broker takes the relayed queues out of
	// it). It must call next, which runs the rest of the process, and
	// return next's error; what it defers runs once the client, the
	// applications' components and the ops have stopped.
	configure func(ctx context.Context, e *engine, next func() error) error
	// bind runs after the client is built and before it starts: serve opens
	// its listeners there, so that a bad address fails before any work.
	// release undoes it when the client does not start.
	bind func(e *engine) (release func(), err error)
	// started runs once the client and the components run. A value on the
	// channel it returns (nil: none) ends the process early and is the
	// command's error.
	started func(ctx context.Context, e *engine) (<-chan error, error)
	// shutdown runs first at the graceful stop, with the stop's context
	// (serve: the HTTP server drains its requests).
	shutdown func(ctx context.Context)
}

// runProcess is the process serve and work run: it opens (and migrates)
// the engine, builds the client on it, starts the ops' gauges and samples,
// starts the client and the applications' components, and runs until
// SIGINT, SIGTERM or parent's end. It then stops gracefully within
// --shutdown-timeout: the shutdown hook, the client (in-flight deliveries
// finish), the components, the ops, what configure deferred, the pool.
func runProcess(parent context.Context, g *globals, eng *engineFlags, h processHooks) error {
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	e, err := g.openEngine(ctx, eng, nil)
	if err != nil {
		return err
	}
	defer e.pool.Close()
	if h.configure == nil {
		return runClient(ctx, g, eng, e, h)
	}
	return h.configure(ctx, e, func() error { return runClient(ctx, g, eng, e, h) })
}

// runClient is runProcess from building the client to its graceful stop.
func runClient(ctx context.Context, g *globals, eng *engineFlags, e *engine, h processHooks) error {
	client, err := pgoutbox.NewClient(e.pool, e.cfg)
	if err != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	startOps(g, e.pool, e.reg) // gauges on reg (the client writes its samples and heartbeat)
	release := func() {}
	if h.bind != nil {
		if release, err = h.bind(e); err != nil {
			return err
		}
	}
	if err := client.Start(ctx); err != nil {
		release()
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	stopComponents := runComponents(ctx, e.apps, e.log)
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eng.stopTimeout)
		defer cancel()
		if h.shutdown != nil {
			h.shutdown(sctx)
		}
		if err := client.Stop(sctx); err != nil {
			e.log.Warn("worker shutdown", "err", err)
		}
		stopComponents()
	}()
	var early <-chan error
	if h.started != nil {
		if early, err = h.started(ctx, e); err != nil {
			return err
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-early:
	}
	e.log.Info("shutting down")
	if runErr != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: runErr}
	}
	return nil
}
