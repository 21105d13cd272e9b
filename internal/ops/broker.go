package ops

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Broker-readiness defaults (docs/operations.md): PostgreSQL stays the
// default unless one of these conditions persisted over the window.
const (
	// BrokerWindowDefault is how far back samples are read.
	BrokerWindowDefault = 15 * time.Minute
	// BrokerBucketDefault is the bucket a condition must hold in; it
	// persisted when it held in every sampled bucket of the window.
	BrokerBucketDefault = time.Minute
	// BrokerMinCoverageDefault is the share of the window's buckets that must
	// hold samples before anything is concluded.
	BrokerMinCoverageDefault = 0.8
	// BrokerClaimLatencyDefault: claim latency p99 above this while the
	// queue's workers are healthy.
	BrokerClaimLatencyDefault = 250 * time.Millisecond
	// BrokerOldestAgeDefault: oldest available age above this while the
	// queue's workers are healthy.
	BrokerOldestAgeDefault = 30 * time.Second
	// BrokerThroughputDefault: completions per second, all queues together,
	// above this.
	BrokerThroughputDefault = 500.0
)

// Trigger names.
const (
	TriggerClaimLatency = "claim_latency_p99"
	TriggerOldestAge    = "oldest_available_age"
	TriggerThroughput   = "throughput"
)

// Broker decisions.
const (
	// DecisionPostgreSQL: no trigger persisted; PostgreSQL stays the queue.
	DecisionPostgreSQL = "postgresql"
	// DecisionConsiderBroker: a trigger persisted over the window.
	DecisionConsiderBroker = "consider_broker"
	// DecisionInsufficientSamples: too few samples to conclude anything.
	DecisionInsufficientSamples = "insufficient_samples"
)

// AllQueues is the scope of the throughput trigger.
const AllQueues = "(all queues)"

// BrokerOptions configures [BrokerReadiness]. Zero fields take the defaults.
type BrokerOptions struct {
	// Queue restricts the evaluation to one queue (empty: all).
	Queue string
	// Window is how far back samples are read; default BrokerWindowDefault
	// (15 min).
	Window time.Duration
	// Bucket is the unit a condition must hold in; default
	// BrokerBucketDefault (1 min).
	Bucket time.Duration
	// MinCoverage is the share of the window's buckets that must hold
	// samples; default BrokerMinCoverageDefault (0.8).
	MinCoverage float64
	// ClaimLatency is the claim-latency p99 trigger; default
	// BrokerClaimLatencyDefault (250 ms).
	ClaimLatency time.Duration
	// OldestAge is the oldest-available-age trigger; default
	// BrokerOldestAgeDefault (30 s).
	OldestAge time.Duration
	// Throughput is the completions-per-second trigger over all queues;
	// default BrokerThroughputDefault (500).
	Throughput float64
}

func (o BrokerOptions) withDefaults() BrokerOptions {
	if o.Window <= 0 {
		o.Window = BrokerWindowDefault
	}
	if o.Bucket <= 0 {
		o.Bucket = BrokerBucketDefault
	}
	if o.MinCoverage <= 0 || o.MinCoverage > 1 {
		o.MinCoverage = BrokerMinCoverageDefault
	}
	if o.ClaimLatency <= 0 {
		o.ClaimLatency = BrokerClaimLatencyDefault
	}
	if o.OldestAge <= 0 {
		o.OldestAge = BrokerOldestAgeDefault
	}
	if o.Throughput <= 0 {
		o.Throughput = BrokerThroughputDefault
	}
	return o
}

// TriggerResult is one trigger evaluated on one scope (a queue, or
// AllQueues for throughput) over the window's buckets.
type TriggerResult struct {
	Trigger string `json:"trigger"`
	Scope   string `json:"scope"`
	// Threshold and the values are in Unit ("seconds" or "effects/s").
	Threshold float64 `json:"threshold"`
	Unit      string  `json:"unit"`
	// Buckets counts the buckets with a value; Breaching those above the
	// threshold.
	Buckets   int `json:"buckets"`
	Breaching int `json:"breaching"`
	// Min, Max and Latest are over the buckets with a value.
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Latest float64 `json:"latest"`
	// Persisted: the condition held in every bucket with a value, and those
	// were at least the required coverage.
	Persisted bool `json:"persisted"`
}

// BrokerReport is the broker-readiness answer.
type BrokerReport struct {
	// Decision is DecisionPostgreSQL, DecisionConsiderBroker or
	// DecisionInsufficientSamples.
	Decision string `json:"decision"`
	// Reason is one sentence saying why.
	Reason        string  `json:"reason"`
	WindowSeconds float64 `json:"window_seconds"`
	BucketSeconds float64 `json:"bucket_seconds"`
	// BucketsSampled counts the window's buckets holding any sample;
	// BucketsRequired is the coverage needed to conclude.
	BucketsSampled  int `json:"buckets_sampled"`
	BucketsRequired int `json:"buckets_required"`
	BucketsInWindow int `json:"buckets_in_window"`
	// Samples counts the samples read; Triggers has one result per trigger
	// and scope (none when samples are insufficient).
	Samples  int             `json:"samples"`
	Triggers []TriggerResult `json:"triggers"`
}

// BrokerReadiness reads the samples of the last window and evaluates the
// external-broker triggers ([EvaluateBroker]).
func BrokerReadiness(ctx context.Context, db store.DBTX, o BrokerOptions) (*BrokerReport, error) {
	o = o.withDefaults()
	samples, err := store.RecentSamples(ctx, db, o.Window, o.Queue)
	if err != nil {
		return nil, fmt.Errorf("ops: broker readiness: %w", err)
	}
	return EvaluateBroker(samples, o), nil
}

// bucketValue aggregates one queue's samples in one bucket: per worker
// first (a worker's rate is its completions over the time it covered),
// then over workers (rates add up, latency and age take the worst).
type bucketValue struct {
	rate    float64
	p99     float64 // seconds; valid when hasP99
	hasP99  bool
	oldest  float64 // seconds
	healthy bool    // at least one worker of the queue was healthy
	workers map[string]*workerAcc
}

type workerAcc struct {
	completions float64
	seconds     float64
}

// EvaluateBroker evaluates the triggers on samples (a pure function: the
// tests feed it synthetic samples). A condition persisted when it held in
// every bucket that has a value for it, and at least MinCoverage of the
// window's buckets have one. Claim latency and oldest available age are
// judged per queue; throughput over all queues together.
func EvaluateBroker(samples []store.StoredSample, o BrokerOptions) *BrokerReport {
	o = o.withDefaults()
	nb := int(math.Ceil(o.Window.Seconds() / o.Bucket.Seconds()))
	required := int(math.Ceil(float64(nb) * o.MinCoverage))
	rep := &BrokerReport{
		WindowSeconds: o.Window.Seconds(), BucketSeconds: o.Bucket.Seconds(),
		BucketsInWindow: nb, BucketsRequired: required, Samples: len(samples), Triggers: []TriggerResult{},
	}
	// perQueue[queue][bucket]; bucket 0 is the most recent.
	perQueue := map[string]map[int]*bucketValue{}
	for _, s := range samples {
		b := int(s.Age / o.Bucket)
		if b < 0 || b >= nb {
			continue
		}
		qb := perQueue[s.Queue]
		if qb == nil {
			qb = map[int]*bucketValue{}
			perQueue[s.Queue] = qb
		}
		v := qb[b]
		if v == nil {
			v = &bucketValue{workers: map[string]*workerAcc{}}
			qb[b] = v
		}
		w := v.workers[s.Worker]
		if w == nil {
			w = &workerAcc{}
			v.workers[s.Worker] = w
		}
		w.completions += float64(s.Completions)
		w.seconds += s.Interval.Seconds()
		if s.ClaimLatencyP99 != nil {
			v.p99 = max(v.p99, s.ClaimLatencyP99.Seconds())
			v.hasP99 = true
		}
		v.oldest = max(v.oldest, s.OldestAvailableAge.Seconds())
		v.healthy = v.healthy || s.Healthy
	}
	total := map[int]float64{}
	for _, qb := range perQueue {
		for b, v := range qb {
			for _, w := range v.workers {
				if w.seconds > 0 {
					v.rate += w.completions / w.seconds
				}
			}
			total[b] += v.rate
		}
	}
	rep.BucketsSampled = len(total)
	if rep.BucketsSampled < required {
		rep.Decision = DecisionInsufficientSamples
		rep.Reason = fmt.Sprintf("only %d of the last %d %s buckets hold samples (%d needed); "+
			"is a worker (pgoutbox serve or work) running and sampling? PostgreSQL stays the default",
			rep.BucketsSampled, nb, o.Bucket, required)
		return rep
	}

	queues := make([]string, 0, len(perQueue))
	for q := range perQueue {
		queues = append(queues, q)
	}
	slices.Sort(queues)
	for _, q := range queues {
		qb := perQueue[q]
		rep.Triggers = append(rep.Triggers,
			judge(TriggerClaimLatency, q, "seconds", o.ClaimLatency.Seconds(), required, nb, func(b int) (float64, bool, bool) {
				v := qb[b]
				if v == nil || !v.hasP99 {
					return 0, false, false
				}
				// A target outage (most deliveries failing transiently) fills
				// the slots with slow failures: the latency is the target's,
				// which a broker would not remove.
				return v.p99, true, v.p99 > o.ClaimLatency.Seconds() && v.healthy
			}),
			judge(TriggerOldestAge, q, "seconds", o.OldestAge.Seconds(), required, nb, func(b int) (float64, bool, bool) {
				v := qb[b]
				if v == nil {
					return 0, false, false
				}
				return v.oldest, true, v.oldest > o.OldestAge.Seconds() && v.healthy
			}))
	}
	rep.Triggers = append(rep.Triggers,
		judge(TriggerThroughput, AllQueues, "effects/s", o.Throughput, required, nb, func(b int) (float64, bool, bool) {
			r, ok := total[b]
			return r, ok, ok && r > o.Throughput
		}))

	var persisted []TriggerResult
	for _, t := range rep.Triggers {
		if t.Persisted {
			persisted = append(persisted, t)
		}
	}
	if len(persisted) == 0 {
		rep.Decision = DecisionPostgreSQL
		rep.Reason = fmt.Sprintf("no external-broker trigger persisted over the last %s; PostgreSQL stays the default", o.Window)
		return rep
	}
	rep.Decision = DecisionConsiderBroker
	p := persisted[0]
	rep.Reason = fmt.Sprintf("%s on %s stayed above %s in all %d sampled buckets of the last %s (lowest %s); "+
		"consider relaying through NATS JetStream (docs/scale-out.md)",
		p.Trigger, p.Scope, formatValue(p.Threshold, p.Unit), p.Buckets, o.Window, formatValue(p.Min, p.Unit))
	if len(persisted) > 1 {
		rep.Reason += fmt.Sprintf("; %d conditions persisted in all", len(persisted))
	}
	return rep
}

// judge evaluates one trigger over the buckets; at(b) returns the bucket's
// value, whether it has one, and whether it breaches. Bucket 0 is the most
// recent.
func judge(trigger, scope, unit string, threshold float64, required, nb int, at func(b int) (float64, bool, bool)) TriggerResult {
	t := TriggerResult{Trigger: trigger, Scope: scope, Unit: unit, Threshold: threshold}
	for b := nb - 1; b >= 0; b-- {
		v, ok, breach := at(b)
		if !ok {
			continue
		}
		if t.Buckets == 0 || v < t.Min {
			t.Min = v
		}
		t.Max = max(t.Max, v)
		t.Latest = v
		t.Buckets++
		if breach {
			t.Breaching++
		}
	}
	t.Persisted = t.Buckets >= required && t.Breaching == t.Buckets
	return t
}

func formatValue(v float64, unit string) string {
	if unit == "seconds" {
		return time.Duration(v * float64(time.Second)).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
