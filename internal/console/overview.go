package console

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// ChartWindow is the span of the overview's charts, in ChartBuckets
// buckets of a minute.
const (
	ChartWindow  = time.Hour
	ChartBuckets = 60
)

// chartW and chartH are the drawing's size in SVG units.
const chartW, chartH = 600.0, 100.0

// queueChart is one queue's last hour from the persisted samples.
type queueChart struct {
	Queue string
	// Throughput and Backlog are SVG polyline points: completions per
	// second, and the oldest available age in seconds (the backlog's
	// wait), one point a minute, each scaled to its own maximum.
	Throughput, Backlog       string
	MaxThroughput, MaxBacklog float64
	Samples                   int
}

// overviewData is the data of the overview page.
type overviewData struct {
	Status *ops.Snapshot
	Charts []queueChart
}

// overviewPage shows each queue's counts (the numbers of /workers and
// `pgoutbox status`) and, from the samples workers persist, throughput and
// backlog over the last hour, drawn on the server as SVG.
func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request) {
	st, err := ops.Status(r.Context(), c.cfg.Pool, ops.StatusOptions{})
	if err != nil {
		c.fail(w, r, err)
		return
	}
	samples, err := store.RecentSamples(r.Context(), c.cfg.Pool, ChartWindow, "")
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", "Queues", overviewData{Status: st, Charts: charts(samples)})
}

// charts buckets samples by queue and minute: throughput sums the
// completions of every worker over the minute, backlog takes the largest
// oldest-available age any worker saw.
func charts(samples []store.StoredSample) []queueChart {
	type series struct {
		done   [ChartBuckets]float64
		oldest [ChartBuckets]float64
		n      int
	}
	byQueue := map[string]*series{}
	for _, s := range samples {
		b := ChartBuckets - 1 - int(s.Age/time.Minute)
		if b < 0 || b >= ChartBuckets {
			continue
		}
		q := byQueue[s.Queue]
		if q == nil {
			q = &series{}
			byQueue[s.Queue] = q
		}
		q.n++
		q.done[b] += float64(s.Completions) / time.Minute.Seconds()
		q.oldest[b] = max(q.oldest[b], s.OldestAvailableAge.Seconds())
	}
	var out []queueChart
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range byQueue {
			if !yield(k) {
				return
			}
		}
	}) {
		q := byQueue[name]
		ch := queueChart{Queue: name, Samples: q.n, MaxThroughput: slices.Max(q.done[:]), MaxBacklog: slices.Max(q.oldest[:])}
		ch.Throughput, ch.Backlog = points(q.done[:], ch.MaxThroughput), points(q.oldest[:], ch.MaxBacklog)
		out = append(out, ch)
	}
	return out
}

// points draws vs as polyline points scaled so that top is the top edge.
func points(vs []float64, top float64) string {
	var b strings.Builder
	for i, v := range vs {
		y := chartH
		if top > 0 {
			y = chartH - v/top*chartH
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", float64(i)*chartW/float64(len(vs)-1), y)
	}
	return strings.TrimSpace(b.String())
}
