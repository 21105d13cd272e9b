package ops

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// CollectTimeoutDefault bounds the query a scrape may trigger.
const CollectTimeoutDefault = 5 * time.Second

// gaugeStates are the states exported by pgoutbox_effects. Completed rows
// are not counted (they are pruned on a schedule, and counting them would
// scan the retained history): completions are
// pgoutbox_deliveries_total{outcome="success"}.
var gaugeStates = []string{"available", "leased", "dead_letter", "reconciliation_required"}

// Collector exports the database-derived gauges of a [StatsCache]. A scrape
// reuses the cached snapshot while it is fresh, so the database sees at most
// one aggregate query per cache max age however many series and scrapers
// there are. Labels are queue, effect_type and state only.
type Collector struct {
	cache *StatsCache
	log   *slog.Logger

	effects, retrying, parked, oldest, stalled, xmin, refreshed, paused *prometheus.Desc
	errors                                                              prometheus.Counter
}

// NewCollector returns a collector over cache; log may be nil.
func NewCollector(cache *StatsCache, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	qt := []string{"queue", "effect_type"}
	return &Collector{
		cache: cache, log: log,
		effects: prometheus.NewDesc("pgoutbox_effects",
			"Effects by queue, effect type and state (available, leased, dead_letter, reconciliation_required).",
			[]string{"queue", "effect_type", "state"}, nil),
		retrying: prometheus.NewDesc("pgoutbox_effects_retrying",
			"Available effects waiting for a retry (attempts > 0).", qt, nil),
		parked: prometheus.NewDesc("pgoutbox_effects_parked",
			"Available effects parked behind their ordering key's blocked head (counted in pgoutbox_effects too).", qt, nil),
		oldest: prometheus.NewDesc("pgoutbox_oldest_available_age_seconds",
			"Age of the oldest due available effect (database clock); 0 when none waits.", qt, nil),
		stalled: prometheus.NewDesc("pgoutbox_stalled_leases",
			"Leases held longer than the stalled age (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES).", qt, nil),
		paused: prometheus.NewDesc("pgoutbox_queue_paused",
			"1 while the queue is paused (pgoutbox queue pause, or the console): no claim takes its effects; 0 for the other queues with effects.",
			[]string{"queue"}, nil),
		xmin: prometheus.NewDesc("pgoutbox_oldest_xmin_age_seconds",
			"Age of the oldest transaction of this database holding back the xmin horizon (VACUUM).", nil, nil),
		refreshed: prometheus.NewDesc("pgoutbox_stats_refreshed_timestamp_seconds",
			"When the database statistics behind these gauges were last read (database clock).", nil, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "pgoutbox_stats_refresh_errors_total",
			Help: "Failed reads of the database statistics behind the pgoutbox gauges.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.effects, c.retrying, c.parked, c.oldest, c.stalled, c.xmin, c.refreshed, c.paused} {
		ch <- d
	}
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector. When the statistics cannot be
// read, only pgoutbox_stats_refresh_errors_total is exported.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), CollectTimeoutDefault)
	defer cancel()
	snap, err := c.cache.Get(ctx)
	if err != nil {
		c.errors.Inc()
		c.log.Warn("reading pgoutbox statistics for /metrics failed", "err", err)
	} else {
		for _, t := range snap.Types {
			for _, st := range gaugeStates {
				ch <- prometheus.MustNewConstMetric(c.effects, prometheus.GaugeValue, float64(t.count(st)), t.Queue, t.Type, st)
			}
			ch <- prometheus.MustNewConstMetric(c.retrying, prometheus.GaugeValue, float64(t.Retrying), t.Queue, t.Type)
			ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(t.Parked), t.Queue, t.Type)
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, t.OldestAvailableAgeSeconds, t.Queue, t.Type)
			ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, float64(t.StalledLeases), t.Queue, t.Type)
		}
		for _, q := range pausedGauge(snap) {
			ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, q.v, q.queue)
		}
		ch <- prometheus.MustNewConstMetric(c.xmin, prometheus.GaugeValue, snap.OldestXminAgeSeconds)
		ch <- prometheus.MustNewConstMetric(c.refreshed, prometheus.GaugeValue, float64(snap.TakenAt.UnixNano())/1e9)
	}
	c.errors.Collect(ch)
}

func (c Counts) count(state string) int64 {
	switch state {
	case "available":
		return c.Available
	case "leased":
		return c.Leased
	case "dead_letter":
		return c.DeadLetter
	case "reconciliation_required":
		return c.ReconciliationRequired
	}
	return 0
}

type queueValue struct {
	queue string
	v     float64
}

// pausedGauge is pgoutbox_queue_paused: 1 for each paused queue, 0 for
// each other queue with effects.
func pausedGauge(snap *Snapshot) []queueValue {
	var out []queueValue
	for _, p := range snap.Paused {
		out = append(out, queueValue{p.Queue, 1})
	}
	for _, q := range snap.Queues {
		if snap.PausedQueue(q.Queue) == nil {
			out = append(out, queueValue{q.Queue, 0})
		}
	}
	return out
}
