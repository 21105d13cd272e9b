package pgoutbox

import (
	"context"
)

// Unexported engine timings and helpers, exported to this package's external
// tests only.
const (
	ActiveTail        = activeTail
	ClaimRetryInitial = claimRetryInitial
	ClaimRetryMax     = claimRetryMax
)

// ExtendLeasesNow runs one pass of the client's lease extender now.
func (c *Client) ExtendLeasesNow(ctx context.Context) { c.extendLeases(ctx) }

// Heartbeat writes the client's row in pgoutbox.workers now, as its
// heartbeat does every HeartbeatInterval.
func (c *Client) Heartbeat(ctx context.Context) error { return c.beat.Beat(ctx) }
