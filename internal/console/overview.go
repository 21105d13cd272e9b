package console

import (
	"context"
	"fmt"
	"maps"
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
	// Rows are the queues with effects, and the paused queues without.
	Rows []queueRow
	// Window names the completions' window as every view does
	// (ops.WindowLabel: "Completed in the last 5 min").
	Window  string
	Workers int // live worker processes
	Charts  []queueChart
}

// queueRow is one queue of the overview: its counts and what an operator
// must know before reading them.
type queueRow struct {
	ops.Counts
	// Pause is set while the queue is paused.
	Pause *ops.QueuePause
	// Unserved: the queue holds available or leased effects and no live
	// worker works it.
	Unserved bool
	// Served counts the live workers that work the queue.
	Served int
	// BlockedKeys counts the ordering keys whose later effects wait for
	// their head; Stuck those whose head waits for an operator.
	BlockedKeys, Stuck int
	// Waiting counts the effects behind those keys' heads.
	Waiting int64
	// Scheduled counts the effects not yet due (never attempted), NextDue
	// the first due time among them.
	Scheduled int64
	NextDue   *time.Time
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
	d, err := c.queueRows(r.Context(), st)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	d.Charts = charts(samples)
	c.render(w, r, http.StatusOK, "overview", "Queues", d)
}

// queueRows joins the snapshot with the pauses, the live workers, the
// blocked keys and the scheduled effects, by queue.
func (c *Console) queueRows(ctx context.Context, st *ops.Snapshot) (overviewData, error) {
	d := overviewData{Status: st, Window: st.CompletedWindow}
	if d.Window != "" {
		d.Window = strings.ToUpper(d.Window[:1]) + d.Window[1:]
	}
	workers, err := ops.LiveWorkers(ctx, c.cfg.Pool)
	if err != nil {
		return d, err
	}
	unserved, err := ops.UnservedQueues(ctx, c.cfg.Pool)
	if err != nil {
		return d, err
	}
	blocked, err := ops.BlockedKeys(ctx, c.cfg.Pool, ops.BlockedOptions{Limit: BlockedKeysCounted})
	if err != nil {
		return d, err
	}
	extras, err := store.QueueExtras(ctx, c.cfg.Pool)
	if err != nil {
		return d, err
	}
	d.Workers = len(workers)
	rows := map[string]*queueRow{}
	row := func(q string) *queueRow {
		if rows[q] == nil {
			rows[q] = &queueRow{Counts: ops.Counts{Queue: q}}
		}
		return rows[q]
	}
	for _, q := range st.Queues {
		row(q.Queue).Counts = q
	}
	for i := range st.Paused {
		row(st.Paused[i].Queue).Pause = &st.Paused[i]
	}
	for _, u := range unserved {
		if rows[u.Queue] != nil {
			rows[u.Queue].Unserved = true
		}
	}
	for _, w := range workers {
		for _, q := range w.Queues {
			if rows[q.Queue] != nil {
				rows[q.Queue].Served++
			}
		}
	}
	for _, k := range blocked.Keys {
		if rows[k.Queue] != nil {
			rows[k.Queue].BlockedKeys++
			rows[k.Queue].Waiting += k.Waiting
			if k.Stuck {
				rows[k.Queue].Stuck++
			}
		}
	}
	for _, x := range extras {
		if rows[x.Queue] != nil {
			rows[x.Queue].Scheduled, rows[x.Queue].NextDue = x.Scheduled, x.NextDue
		}
	}
	for _, q := range slices.Sorted(maps.Keys(rows)) {
		d.Rows = append(d.Rows, *rows[q])
	}
	return d, nil
}

// BlockedKeysCounted caps the blocked keys the overview counts per load
// (the blocked-keys page lists up to PageSizeMax).
const BlockedKeysCounted = 1000

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
