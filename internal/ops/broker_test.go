package ops_test

import (
	"fmt"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// sampleSeries writes one worker's samples for a queue every 10 s over the
// last n*10 s (the newest 5 s ago), with values from at(k), k = 0 the newest.
func (b *bundle) sampleSeries(t *testing.T, queue, worker string, n int, at func(k int) (p99ms *float64, oldestS, perSecond float64, healthy bool)) {
	t.Helper()
	for k := range n {
		p99, oldest, rate, healthy := at(k)
		_, err := b.pool.Exec(b.ctx, `
			INSERT INTO pgoutbox.samples (sampled_at, queue, worker, interval_s, claims, completions, failures,
			    claim_latency_p99_ms, oldest_available_age_s, completed_per_second, workers_healthy)
			VALUES (now() - make_interval(secs => 5 + 10 * $1), $2, $3, 10, $4, $4, 0, $5, $6, $7, $8)`,
			k, queue, worker, int64(rate*10), p99, oldest, rate, healthy)
		if err != nil {
			t.Fatal(err)
		}
	}
}

func ms(v float64) *float64 { return &v }

// calm is a healthy queue under every trigger.
func calm(int) (*float64, float64, float64, bool) { return ms(20), 2, 100, true }

func trigger(rep *ops.BrokerReport, name, scope string) ops.TriggerResult {
	for _, tr := range rep.Triggers {
		if tr.Trigger == name && tr.Scope == scope {
			return tr
		}
	}
	return ops.TriggerResult{}
}

func persisted(rep *ops.BrokerReport) []string {
	var out []string
	for _, tr := range rep.Triggers {
		if tr.Persisted {
			out = append(out, tr.Trigger+"@"+tr.Scope)
		}
	}
	return out
}

func TestBrokerReadiness(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		seed     func(b *bundle, t *testing.T)
		decision string
		persist  []string
		check    func(t *testing.T, rep *ops.BrokerReport)
	}{
		{
			name:     "none",
			seed:     func(b *bundle, t *testing.T) { b.sampleSeries(t, "q", "w1", 90, calm) },
			decision: ops.DecisionPostgreSQL,
			check: func(t *testing.T, rep *ops.BrokerReport) {
				tr := trigger(rep, ops.TriggerThroughput, ops.AllQueues)
				if tr.Buckets != 15 || tr.Min != 100 || tr.Max != 100 || tr.Breaching != 0 {
					t.Fatalf("throughput: %+v", tr)
				}
			},
		},
		{
			name: "claim latency alone",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 90, func(k int) (*float64, float64, float64, bool) { return ms(300 + float64(k)), 2, 100, true })
			},
			decision: ops.DecisionConsiderBroker,
			persist:  []string{"claim_latency_p99@q"},
			check: func(t *testing.T, rep *ops.BrokerReport) {
				tr := trigger(rep, ops.TriggerClaimLatency, "q")
				// Buckets are 60 s: the newest holds k = 0..5, whose worst p99 is 305 ms.
				if tr.Breaching != 15 || tr.Min != 0.305 || tr.Latest != 0.305 || tr.Threshold != 0.25 {
					t.Fatalf("latency: %+v", tr)
				}
			},
		},
		{
			name: "oldest age alone",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 90, func(int) (*float64, float64, float64, bool) { return ms(20), 45, 100, true })
			},
			decision: ops.DecisionConsiderBroker,
			persist:  []string{"oldest_available_age@q"},
		},
		{
			name: "oldest age while workers are unhealthy is not a capacity problem",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 90, func(int) (*float64, float64, float64, bool) { return ms(20), 45, 0, false })
			},
			decision: ops.DecisionPostgreSQL,
		},
		{
			name: "claim latency while workers are unhealthy (a target outage) is not a capacity problem",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 90, func(int) (*float64, float64, float64, bool) { return ms(900), 2, 0, false })
			},
			decision: ops.DecisionPostgreSQL,
			check: func(t *testing.T, rep *ops.BrokerReport) {
				if tr := trigger(rep, ops.TriggerClaimLatency, "q"); tr.Buckets != 15 || tr.Breaching != 0 || tr.Min != 0.9 {
					t.Fatalf("latency: %+v", tr)
				}
			},
		},
		{
			name: "throughput alone, added over queues and workers",
			seed: func(b *bundle, t *testing.T) {
				rate := func(int) (*float64, float64, float64, bool) { return ms(20), 1, 200, true }
				b.sampleSeries(t, "a", "w1", 90, rate)
				b.sampleSeries(t, "a", "w2", 90, rate)
				b.sampleSeries(t, "b", "w1", 90, rate) // 600/s in all
			},
			decision: ops.DecisionConsiderBroker,
			persist:  []string{"throughput@" + ops.AllQueues},
			check: func(t *testing.T, rep *ops.BrokerReport) {
				if tr := trigger(rep, ops.TriggerThroughput, ops.AllQueues); tr.Min != 600 {
					t.Fatalf("throughput: %+v", tr)
				}
			},
		},
		{
			name: "a single calm minute breaks persistence",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 90, func(k int) (*float64, float64, float64, bool) {
					if k/6 == 7 { // one whole bucket in the middle
						return ms(20), 2, 100, true
					}
					return ms(400), 2, 100, true
				})
			},
			decision: ops.DecisionPostgreSQL,
			check: func(t *testing.T, rep *ops.BrokerReport) {
				if tr := trigger(rep, ops.TriggerClaimLatency, "q"); tr.Breaching != 14 || tr.Buckets != 15 {
					t.Fatalf("latency: %+v", tr)
				}
			},
		},
		{
			name: "too few samples",
			seed: func(b *bundle, t *testing.T) {
				b.sampleSeries(t, "q", "w1", 30, func(int) (*float64, float64, float64, bool) { return ms(900), 120, 900, true })
			},
			decision: ops.DecisionInsufficientSamples,
			check: func(t *testing.T, rep *ops.BrokerReport) {
				if rep.BucketsSampled != 5 || rep.BucketsRequired != 12 || len(rep.Triggers) != 0 {
					t.Fatalf("%+v", rep)
				}
			},
		},
		{
			name:     "no samples at all",
			seed:     func(*bundle, *testing.T) {},
			decision: ops.DecisionInsufficientSamples,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			c.seed(b, t)
			rep, err := ops.BrokerReadiness(b.ctx, b.pool, ops.BrokerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Decision != c.decision || fmt.Sprint(persisted(rep)) != fmt.Sprint(c.persist) {
				t.Fatalf("decision %s, persisted %v; want %s, %v\n%s", rep.Decision, persisted(rep), c.decision, c.persist, rep.Reason)
			}
			if c.check != nil {
				c.check(t, rep)
			}
		})
	}
}

func TestBrokerReadinessQueueFilter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.sampleSeries(t, "slow", "w1", 90, func(int) (*float64, float64, float64, bool) { return ms(500), 1, 10, true })
	b.sampleSeries(t, "fast", "w1", 90, calm)
	rep, err := ops.BrokerReadiness(b.ctx, b.pool, ops.BrokerOptions{Queue: "fast"})
	if err != nil || rep.Decision != ops.DecisionPostgreSQL {
		t.Fatalf("%v %+v", err, rep)
	}
	rep, err = ops.BrokerReadiness(b.ctx, b.pool, ops.BrokerOptions{Queue: "fast' OR 'x'='x"})
	if err != nil || rep.Decision != ops.DecisionInsufficientSamples || rep.Samples != 0 {
		t.Fatalf("injection: %v %+v", err, rep)
	}
}
