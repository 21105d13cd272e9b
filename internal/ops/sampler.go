package ops

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Sampler defaults.
const (
	// SampleIntervalDefault is how often a worker process writes its samples.
	SampleIntervalDefault = 10 * time.Second
	// SampleRetentionDefault is how long samples are kept.
	SampleRetentionDefault = 24 * time.Hour
)

// QueueCounters are one queue's cumulative counters in this process.
type QueueCounters struct {
	// Claims counts effects claimed; Completions those completed.
	Claims      float64
	Completions float64
	// Failures counts deliveries that failed for transient reasons (retry,
	// retry_after, ambiguous, lease_lost); permanent failures are the
	// effect's fault, not the worker's.
	Failures float64
	// LatencyBounds and LatencyCumulative are the claim-latency histogram's
	// bucket upper bounds (seconds) and cumulative counts; LatencyCount is
	// the total number of observations.
	LatencyBounds     []float64
	LatencyCumulative []uint64
	LatencyCount      uint64
}

// Source reports this process's cumulative per-queue counters.
type Source interface {
	Read() (map[string]QueueCounters, error)
}

// Engine metric names read by [RegistrySource] (registered by the root
// package's Client when Config.Registerer is set).
const (
	metricClaimed      = "pgoutbox_claimed_total"
	metricDeliveries   = "pgoutbox_deliveries_total"
	metricClaimLatency = "pgoutbox_claim_latency_seconds"
)

// RegistrySource reads the engine's own instruments from a Prometheus
// gatherer: claims (pgoutbox_claimed_total), completions and failures
// (pgoutbox_deliveries_total by outcome) and the claim-latency histogram
// (pgoutbox_claim_latency_seconds).
func RegistrySource(g prometheus.Gatherer) Source { return registrySource{g} }

type registrySource struct{ g prometheus.Gatherer }

func (r registrySource) Read() (map[string]QueueCounters, error) {
	families, err := r.g.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]QueueCounters{}
	get := func(m *dto.Metric) (string, QueueCounters) {
		q := label(m, "queue")
		return q, out[q]
	}
	for _, f := range families {
		switch f.GetName() {
		case metricClaimed:
			for _, m := range f.GetMetric() {
				q, c := get(m)
				c.Claims += m.GetCounter().GetValue()
				out[q] = c
			}
		case metricDeliveries:
			for _, m := range f.GetMetric() {
				q, c := get(m)
				switch label(m, "outcome") {
				case "success":
					c.Completions += m.GetCounter().GetValue()
				case "retry", "retry_after", "ambiguous", "lease_lost":
					c.Failures += m.GetCounter().GetValue()
				}
				out[q] = c
			}
		case metricClaimLatency:
			for _, m := range f.GetMetric() {
				q, c := get(m)
				h := m.GetHistogram()
				c.LatencyBounds, c.LatencyCumulative = c.LatencyBounds[:0], c.LatencyCumulative[:0]
				for _, b := range h.GetBucket() {
					c.LatencyBounds = append(c.LatencyBounds, b.GetUpperBound())
					c.LatencyCumulative = append(c.LatencyCumulative, b.GetCumulativeCount())
				}
				c.LatencyCount = h.GetSampleCount()
				out[q] = c
			}
		}
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// SamplerConfig configures a Sampler. Zero fields take the defaults.
type SamplerConfig struct {
	// Worker identifies this process in the samples; default
	// "<hostname>-<pid>".
	Worker string
	// Interval default SampleIntervalDefault (10 s).
	Interval time.Duration
	// Retention default SampleRetentionDefault (24 h).
	Retention time.Duration
	// Logger default discards.
	Logger *slog.Logger
}

// Sampler persists, every interval, one aggregate row per queue this
// process works into pgoutbox.samples: claims, completions, transient
// failures, claim latency p99 (from the histogram's buckets over the
// interval), the queue's oldest available age (from the shared
// [StatsCache], refreshed each interval) and whether the workers were
// healthy. It prunes rows older than the retention.
//
// A queue's workers were healthy in an interval when no more than half of
// their deliveries failed transiently, and they claimed something or nothing
// had waited a whole interval. `readiness broker` reads these rows.
type Sampler struct {
	db    store.DBTX
	stats *StatsCache
	src   Source
	cfg   SamplerConfig

	mu   sync.Mutex
	prev map[string]QueueCounters
	at   time.Time
}

// NewSampler returns a sampler whose first interval starts now: the source's
// counters are taken to have been zero when the sampler was created (create
// it before the Client starts).
func NewSampler(db store.DBTX, stats *StatsCache, src Source, cfg SamplerConfig) *Sampler {
	if cfg.Worker == "" {
		host, _ := os.Hostname()
		cfg.Worker = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.Interval <= 0 {
		cfg.Interval = SampleIntervalDefault
	}
	if cfg.Retention <= 0 {
		cfg.Retention = SampleRetentionDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sampler{db: db, stats: stats, src: src, cfg: cfg, prev: map[string]QueueCounters{}, at: time.Now()}
}

// Run samples every interval until ctx ends, then returns nil. A failure
// is logged once per outage (engine.Outage) and the next interval tries
// again. The end of ctx never cuts a sample short (it runs under
// engine.Outlive).
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	out := engine.Outage{Log: s.cfg.Logger, What: "writing the aggregate samples"}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			fctx, cancel := engine.Outlive(ctx)
			_, err := s.Sample(fctx)
			cancel()
			if ctx.Err() == nil {
				out.Report(err)
			}
		}
	}
}

// Sample writes the samples of the interval that ends now and returns
// them.
func (s *Sampler) Sample(ctx context.Context) ([]store.Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, err := s.src.Read()
	if err != nil {
		return nil, fmt.Errorf("ops: sample: read counters: %w", err)
	}
	snap, err := s.stats.Refresh(ctx)
	if err != nil {
		return nil, fmt.Errorf("ops: sample: %w", err)
	}
	now := time.Now()
	interval := now.Sub(s.at)
	oldest := map[string]float64{}
	for _, q := range snap.Queues {
		oldest[q.Queue] = q.OldestAvailableAgeSeconds
	}
	var samples []store.Sample
	for _, q := range slices.Sorted(maps.Keys(cur)) {
		if q == "" {
			continue
		}
		c, p := cur[q], s.prev[q]
		smp := store.Sample{
			Queue: q, Worker: s.cfg.Worker, Interval: interval,
			Claims:             int64(math.Round(c.Claims - p.Claims)),
			Completions:        int64(math.Round(c.Completions - p.Completions)),
			Failures:           int64(math.Round(c.Failures - p.Failures)),
			OldestAvailableAge: time.Duration(oldest[q] * float64(time.Second)),
		}
		if p99, ok := deltaQuantile(0.99, c, p); ok {
			d := time.Duration(p99 * float64(time.Second))
			smp.ClaimLatencyP99 = &d
		}
		deliveries := smp.Completions + smp.Failures
		smp.Healthy = smp.Failures*2 <= deliveries &&
			(smp.Claims > 0 || smp.OldestAvailableAge < interval)
		samples = append(samples, smp)
	}
	if len(samples) > 0 {
		if err := store.InsertSamples(ctx, s.db, samples); err != nil {
			return nil, fmt.Errorf("ops: sample: %w", err)
		}
	}
	if _, err := store.PruneSamples(ctx, s.db, s.cfg.Retention); err != nil {
		return nil, fmt.Errorf("ops: sample: prune: %w", err)
	}
	s.prev, s.at = cur, now
	return samples, nil
}

// deltaQuantile estimates the q-quantile of the claim latencies observed
// between two readings of the histogram, interpolating linearly inside the
// bucket like PromQL's histogram_quantile (the +Inf bucket answers its
// lower bound). ok is false when nothing was observed.
func deltaQuantile(q float64, cur, prev QueueCounters) (float64, bool) {
	total := float64(cur.LatencyCount) - float64(prev.LatencyCount)
	if total <= 0 || len(cur.LatencyBounds) == 0 {
		return 0, false
	}
	count := func(i int) float64 {
		n := float64(cur.LatencyCumulative[i])
		if i < len(prev.LatencyCumulative) {
			n -= float64(prev.LatencyCumulative[i])
		}
		return n
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, upper := range cur.LatencyBounds {
		n := count(i)
		if n >= rank {
			if n == below {
				return upper, true
			}
			return lower + (upper-lower)*(rank-below)/(n-below), true
		}
		lower, below = upper, n
	}
	return cur.LatencyBounds[len(cur.LatencyBounds)-1], true
}
