package pgoutbox

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the client's own instruments. Labels are only queue,
// effect_type and outcome (docs/operations.md).
type metrics struct {
	deliveries   *prometheus.CounterVec
	claimLatency *prometheus.HistogramVec
	lag          *prometheus.HistogramVec
	claimed      *prometheus.CounterVec
	rescued      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_deliveries_total",
			Help: "Deliveries by queue, effect type and outcome.",
		}, []string{"queue", "effect_type", "outcome"}),
		claimLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pgoutbox_claim_latency_seconds",
			Help:    "Time from an effect becoming available to its claim (database clock).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"queue"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "pgoutbox_outbox_lag_seconds",
			Help:    "Time from an effect's creation to its completion (database clock).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"queue", "effect_type"}),
		claimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_claimed_total",
			Help: "Effects leased by claims.",
		}, []string{"queue"}),
		rescued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_rescued_total",
			Help: "Expired leases recovered by the sweeper, by the state they were routed to.",
		}, []string{"queue", "effect_type", "state"}),
	}
	if reg != nil {
		reg.MustRegister(m.deliveries, m.claimLatency, m.lag, m.claimed, m.rescued)
	}
	return m
}
