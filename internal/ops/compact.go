package ops

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// CompactOptions configures Compact.
type CompactOptions struct {
	// DryRun reports the current sizes and rebuilds nothing.
	DryRun bool
}

// CompactedRelation is one table or index before and after compaction.
type CompactedRelation struct {
	Name        string `json:"name"`
	Table       string `json:"table"`
	BytesBefore int64  `json:"bytes_before"`
	BytesAfter  int64  `json:"bytes_after"`
}

// CompactResult is what Compact did (or would measure, on a dry run).
type CompactResult struct {
	DryRun      bool                `json:"dry_run"`
	Relations   []CompactedRelation `json:"relations"`
	BytesBefore int64               `json:"bytes_before"`
	BytesAfter  int64               `json:"bytes_after"`
}

// Compact gives the space of deleted effects back: VACUUM truncates the
// empty tail of each engine table and REINDEX CONCURRENTLY rebuilds its
// indexes, without blocking enqueues, claims or completions. Retention and
// autovacuum make that space reusable but never smaller: run this after a
// burst has drained, not on a schedule. Rows are not changed.
func Compact(ctx context.Context, pool *pgxpool.Pool, o CompactOptions) (*CompactResult, error) {
	before, err := store.RelationSizes(ctx, pool, store.EngineTables)
	if err != nil {
		return nil, fmt.Errorf("ops: compact: %w", err)
	}
	after := before
	if !o.DryRun {
		for _, t := range store.EngineTables {
			if err := store.Compact(ctx, pool, t); err != nil {
				return nil, fmt.Errorf("ops: compact: %w", err)
			}
		}
		if after, err = store.RelationSizes(ctx, pool, store.EngineTables); err != nil {
			return nil, fmt.Errorf("ops: compact: %w", err)
		}
	}
	sizeAfter := make(map[string]int64, len(after))
	for _, r := range after {
		sizeAfter[r.Name] = r.Bytes
	}
	res := &CompactResult{DryRun: o.DryRun, Relations: make([]CompactedRelation, 0, len(before))}
	for _, r := range before {
		c := CompactedRelation{Name: r.Name, Table: r.Table, BytesBefore: r.Bytes, BytesAfter: sizeAfter[r.Name]}
		res.Relations = append(res.Relations, c)
		res.BytesBefore += c.BytesBefore
		res.BytesAfter += c.BytesAfter
	}
	return res, nil
}
