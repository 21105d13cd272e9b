package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// BenchmarkPage reads a batch of 20,000 stream effects of 300-byte payloads
// page by page (pages of 1,000) as the Client's batch loop does, and
// reports the time and allocations per effect read (the Client's share
// of a batch drain: the statement, the receive and the scan):
//
//	go test -run '^$' -bench BenchmarkPage -benchmem ./internal/store
func BenchmarkPage(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	ctx := context.Background()
	const n, size = 20000, 1000
	if err := SetStorage(ctx, pool, []string{"q"}, []string{"batch"}, []int32{1}); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"record":"` + strings.Repeat("x", 280) + `"}`)
	for i := 0; i < n; i += size {
		effects := make([]NewEffect, size)
		for j := range effects {
			effects[j] = NewEffect{Queue: "q", Type: "t", Key: fmt.Sprint(i + j), Payload: payload, MaxAttempts: 8}
		}
		if _, err := Insert(ctx, pool, effects); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := Tick(ctx, pool, "q"); err != nil {
		b.Fatal(err)
	}
	batch, ok, err := ClaimBatch(ctx, pool, "q", "bench", time.Hour)
	if err != nil || !ok {
		b.Fatalf("claim batch: %v, %v", ok, err)
	}
	read := 0
	for b.Loop() {
		after := batch.DoneThrough
		for {
			page, err := Page(ctx, pool, batch, after, size)
			if err != nil {
				b.Fatal(err)
			}
			read += len(page)
			if len(page) < size {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	if read != n*b.N {
		b.Fatalf("read %d effects in %d loops, want %d each", read, b.N, n)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(read), "ns/effect")
}
