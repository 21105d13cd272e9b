package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// CompletedWindow is the one window over which every view counts recent
// completions and their lag: `pgoutbox status`'s column, the console's
// overview and the projection's /workers page. It is LagWindowDefault.
const CompletedWindow = 5 * time.Minute

// CompletedWindowLabel names CompletedWindow wherever a count over it is
// shown: "completed in the last 5 min".
var CompletedWindowLabel = WindowLabel(CompletedWindow)

// WindowLabel names a completion window: "completed in the last 5 min" for
// whole minutes, else with Go's duration ("completed in the last 1m30s").
func WindowLabel(d time.Duration) string {
	if d > 0 && d%time.Minute == 0 {
		return fmt.Sprintf("completed in the last %d min", d/time.Minute)
	}
	return "completed in the last " + d.String()
}

// QueueCompleted is one queue's completions within CompletedWindow.
type QueueCompleted struct {
	Queue string `json:"queue"`
	// Completed counts the effects completed within the window.
	Completed int64 `json:"completed"`
	// PerSecond is Completed over the window's length.
	PerSecond float64 `json:"per_second"`
	// MeanLagSeconds is the mean of completed_at - created_at over them.
	MeanLagSeconds float64 `json:"mean_lag_seconds"`
}

// CompletedInWindow returns, by queue, the effects completed within
// CompletedWindow (database clock); queues with none are absent. One
// statement over the completed-effects index.
func CompletedInWindow(ctx context.Context, db store.DBTX) ([]QueueCompleted, error) {
	rows, err := store.Throughput(ctx, db, CompletedWindow)
	if err != nil {
		return nil, fmt.Errorf("ops: completed in window: %w", err)
	}
	out := make([]QueueCompleted, len(rows))
	for i, r := range rows {
		out[i] = QueueCompleted{Queue: r.Queue, Completed: r.Completed,
			PerSecond: float64(r.Completed) / CompletedWindow.Seconds(), MeanLagSeconds: r.MeanLag}
	}
	return out, nil
}
