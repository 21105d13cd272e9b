package pgoutbox

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Unexported engine timings and helpers, exported to this package's external
// tests only.
const (
	ActiveTail        = activeTail
	ClaimRetryInitial = claimRetryInitial
	ClaimRetryMax     = claimRetryMax
)

// BatchRunContexts counts, over the client's queues, the batch deliveries'
// contexts not yet cancelled.
func (c *Client) BatchRunContexts() int64 {
	var n int64
	for _, q := range c.queues {
		n += q.runContexts.Load()
	}
	return n
}

// BatchLoopRuns reports whether the batch loop of queue runs.
func (c *Client) BatchLoopRuns(queue string) bool { return c.queues[queue].batchLoop.Load() }

// ExtendLeasesNow runs one pass of the client's lease extender now.
func (c *Client) ExtendLeasesNow(ctx context.Context) { c.extendLeases(ctx) }

// Heartbeat writes the client's row in pgoutbox.workers now, as its
// heartbeat does every HeartbeatInterval.
func (c *Client) Heartbeat(ctx context.Context) error { return c.beat.Beat(ctx) }

// EnqueueBatchArrays is EnqueueBatch sending the batch as parameter
// arrays whatever its size, each effect keeping traceparent ("" none).
func EnqueueBatchArrays(ctx context.Context, tx pgx.Tx, effects []Effect, traceparent string) ([]int64, error) {
	return enqueueBatchForced(ctx, tx, effects, traceparent, pathArrays)
}

// EnqueueBatchCopy is EnqueueBatch sending the batch by COPY whatever its
// size, each effect keeping traceparent ("" none).
func EnqueueBatchCopy(ctx context.Context, tx pgx.Tx, effects []Effect, traceparent string) ([]int64, error) {
	return enqueueBatchForced(ctx, tx, effects, traceparent, pathCopy)
}

func enqueueBatchForced(ctx context.Context, tx pgx.Tx, effects []Effect, traceparent string, path enqueuePath) ([]int64, error) {
	if tx == nil || len(effects) == 0 {
		return EnqueueBatch(ctx, tx, effects)
	}
	return enqueueBatchVia(ctx, tx, effects, traceparent, path)
}
