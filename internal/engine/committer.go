package engine

import (
	"context"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// CommitTimeout bounds one group commit.
const CommitTimeout = 30 * time.Second

// Committer completes many fenced effects in one statement (a group
// commit): each worker takes one request, then whatever else is already
// queued, up to the batch size.
type Committer struct {
	db    store.DBTX
	batch int
	reqs  chan commitReq
	wg    sync.WaitGroup
}

type commitReq struct {
	fence store.Fence
	done  chan Committed
}

// Committed is the result of one completion.
type Committed struct {
	// Lag is commit → completion (the database clock) when OK.
	Lag time.Duration
	// OK is false when the lease was lost: nothing was written.
	OK bool
	// Err is the statement's error (for the whole group).
	Err error
}

// StartCommitter starts workers group committers of at most batch
// completions each on db.
func StartCommitter(db store.DBTX, batch, workers int) *Committer {
	c := &Committer{db: db, batch: batch, reqs: make(chan commitReq, batch)}
	for range workers {
		c.wg.Add(1)
		go c.run()
	}
	return c
}

// Complete completes the effect fenced by f in the next group commit and
// returns its result. It must not be called after Close.
func (c *Committer) Complete(f store.Fence) Committed {
	done := make(chan Committed, 1)
	c.reqs <- commitReq{fence: f, done: done}
	return <-done
}

// Close lets the workers commit what is queued and waits for them.
func (c *Committer) Close() {
	close(c.reqs)
	c.wg.Wait()
}

func (c *Committer) run() {
	defer c.wg.Done()
	batch := make([]commitReq, 0, c.batch)
	fences := make([]store.Fence, 0, c.batch)
	for req := range c.reqs {
		batch = append(batch[:0], req)
	drain:
		for len(batch) < c.batch {
			select {
			case r, ok := <-c.reqs:
				if !ok {
					break drain
				}
				batch = append(batch, r)
			default:
				break drain
			}
		}
		fences = fences[:0]
		for _, r := range batch {
			fences = append(fences, r.fence)
		}
		ctx, cancel := context.WithTimeout(context.Background(), CommitTimeout)
		done, err := store.Complete(ctx, c.db, fences)
		cancel()
		for _, r := range batch {
			lag, ok := done[r.fence]
			r.done <- Committed{Lag: lag, OK: ok, Err: err}
		}
	}
}
