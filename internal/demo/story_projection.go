package demo

import (
	"context"

	"github.com/pgoutbox/pgoutbox"
)

// projectionStory drives the record projection.
type projectionStory struct {
	d *Demo
}

func newProjectionStory(d *Demo, _ *pgoutbox.Config) (*projectionStory, error) {
	return &projectionStory{d: d}, nil
}

func (p *projectionStory) run(context.Context) error { return nil }

func (p *projectionStory) close() {}

// ProjectionExpectations are the queue/state counts the projection story
// ends with for an import of n records (none until the story is wired).
func ProjectionExpectations(n int) map[string]int64 { return map[string]int64{} }
