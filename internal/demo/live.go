package demo

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

var liveMu sync.Mutex

// live shows effects by state, throughput and lag while the story runs: a
// redrawn line on a terminal, a plain line every 5 s otherwise.
func (d *Demo) live(ctx context.Context) {
	every := 5 * time.Second
	if d.o.Live {
		every = 250 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	last, lastAt := d.counts.deliveries.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			line, err := d.statusLine(ctx)
			if err != nil {
				continue
			}
			done := d.counts.deliveries.Load()
			rate := float64(done-last) / now.Sub(lastAt).Seconds()
			last, lastAt = done, now
			line = fmt.Sprintf("%s | %.0f deliveries/s | %d retries", line, rate, d.counts.retries.Load())
			liveMu.Lock()
			if d.o.Live {
				fmt.Fprintf(d.o.Out, "\r\033[K%s", line)
			} else {
				fmt.Fprintf(d.o.Out, "  status: %s\n", line)
			}
			liveMu.Unlock()
		}
	}
}

// clearLive erases the live line before other output.
func (d *Demo) clearLive() {
	if d.o.Live {
		liveMu.Lock()
		fmt.Fprint(d.o.Out, "\r\033[K")
		liveMu.Unlock()
	}
}

func (d *Demo) statusLine(ctx context.Context) (string, error) {
	byQueue, err := store.CountCreatedSince(ctx, d.o.Pool, d.since)
	if err != nil {
		return "", err
	}
	counts := map[string]int64{}
	for _, c := range byQueue {
		counts[c.State] += c.Count
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	return "effects: " + strings.Join(parts, ", "), nil
}
