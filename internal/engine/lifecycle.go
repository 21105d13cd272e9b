package engine

import "github.com/pgoutbox/pgoutbox/internal/lifecycle"

// Lifecycle is internal/lifecycle's, shared with the broker adapters.
type Lifecycle = lifecycle.Lifecycle

// NewLifecycle returns a Lifecycle whose errors start with name.
func NewLifecycle(name string) *Lifecycle { return lifecycle.New(name) }
