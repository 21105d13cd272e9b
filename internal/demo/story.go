package demo

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Story runs both applications' stories side by side, waits until every
// effect of this run has settled, and returns the summary.
func (d *Demo) Story(ctx context.Context) (Summary, error) {
	started := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.o.StoryTimeout)
	defer cancel()
	liveCtx, stopLive := context.WithCancel(ctx)
	liveDone := make(chan struct{})
	go func() { defer close(liveDone); d.live(liveCtx) }()

	fmt.Fprintf(d.o.Out, "pgoutbox demo (run %s): serving on %s — open %s/workers\n", d.run, d.base, d.base)
	var reconcileID int64
	errc := make(chan error, 2)
	go func() {
		var err error
		reconcileID, err = d.releaseStory(ctx)
		errc <- err
	}()
	go func() { errc <- d.proj.run(ctx) }()
	err := errors.Join(<-errc, <-errc)
	if err == nil {
		err = d.settle(ctx)
	}
	stopLive()
	<-liveDone
	d.clearLive()
	s, serr := d.summarize(context.WithoutCancel(ctx), started, reconcileID, err)
	if serr != nil {
		return s, serr
	}
	return s, err
}

// settle waits until no effect of this run is available or leased.
func (d *Demo) settle(ctx context.Context) error {
	return waitFor(ctx, "every effect to settle", func() (bool, error) {
		n, err := d.countRun(ctx, "", "available", "leased")
		return n == 0, err
	})
}
