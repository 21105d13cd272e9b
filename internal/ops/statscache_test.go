package ops_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// TestStatsCachePausesAfterASlowQuery: a status query that ran for
// StatsPauseFloor or longer is not repeated until StatsPause times its
// duration passed (a sampler or a scrape then reads the snapshot it
// made), so status at a backlog of millions does not keep a backend busy;
// a fast one is repeated on every Refresh.
func TestStatsCachePausesAfterASlowQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	available := func(snap *ops.Snapshot) int64 {
		for _, q := range snap.Queues {
			if q.Queue == "q" {
				return q.Available
			}
		}
		return 0
	}
	cache := ops.NewStatsCache(b.pool, ops.StatusOptions{}, time.Nanosecond)
	seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "available"})
	snap, err := cache.Refresh(b.ctx)
	if err != nil || available(snap) != 1 {
		t.Fatalf("first refresh: %d available, %v; want 1", available(snap), err)
	}

	cache.SetTook(time.Hour) // as if that query had run for an hour
	seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "available"})
	for name, get := range map[string]func() (*ops.Snapshot, error){
		"Refresh": func() (*ops.Snapshot, error) { return cache.Refresh(b.ctx) },
		"Get":     func() (*ops.Snapshot, error) { return cache.Get(b.ctx) },
	} {
		if snap, err := get(); err != nil || available(snap) != 1 {
			t.Errorf("%s right after an hour-long query: %d available, %v; want the cached 1", name, available(snap), err)
		}
	}

	cache.SetTook(ops.StatsPauseFloor - time.Millisecond) // a fast query: no pause
	if snap, err := cache.Refresh(b.ctx); err != nil || available(snap) != 2 {
		t.Errorf("refresh after a fast query: %d available, %v; want 2", available(snap), err)
	}
}
