package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestSamplerWithRealClient runs a real Client, lets it deliver effects
// (some failing once), and checks the sample the sampler writes from the
// engine's instruments and the database.
func TestSamplerWithRealClient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	cache := ops.NewStatsCache(b.pool, ops.StatusOptions{}, time.Hour)
	sampler := ops.NewSampler(b.pool, cache, ops.RegistrySource(reg), ops.SamplerConfig{Worker: "w-test"})

	client, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Registerer: reg,
		BackoffCap: time.Millisecond,
		Queues:     map[string]pgoutbox.QueueConfig{"work": {Concurrency: 4}},
		Types: []pgoutbox.EffectType{{
			Name: "job", ReplaySafe: true,
			Handler: func(_ context.Context, d *pgoutbox.Delivery) error {
				if d.Attempt == 1 && d.Key == "flaky" {
					return pgoutbox.Retry(errors.New("transient"))
				}
				return nil
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(64)
	defer unsubscribe()
	if err := client.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := client.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	keys := []string{"a", "b", "c", "flaky"}
	err = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, k := range keys {
			if _, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "work", Type: "job", Key: k}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for completed := 0; completed < len(keys); {
		select {
		case e := <-events:
			if e.State == pgoutbox.StateCompleted {
				completed++
			}
		case <-b.ctx.Done():
			t.Fatal("effects were not delivered")
		}
	}

	samples, err := sampler.Sample(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 1 {
		t.Fatalf("samples: %+v", samples)
	}
	s := samples[0]
	if s.Queue != "work" || s.Worker != "w-test" || s.Claims != 5 || s.Completions != 4 || s.Failures != 1 ||
		s.ClaimLatencyP99 == nil || !s.Healthy || s.OldestAvailableAge != 0 || s.Interval <= 0 {
		t.Fatalf("sample: %+v", s)
	}
	var rows, claims, completions int64
	var perSecond float64
	err = b.pool.QueryRow(b.ctx, `SELECT count(*), sum(claims), sum(completions), max(completed_per_second)
		FROM pgoutbox.samples WHERE worker = 'w-test' AND queue = 'work' AND claim_latency_p99_ms IS NOT NULL`).
		Scan(&rows, &claims, &completions, &perSecond)
	if err != nil || rows != 1 || claims != 5 || completions != 4 || perSecond <= 0 {
		t.Fatalf("stored: %v rows=%d claims=%d completions=%d rate=%v", err, rows, claims, completions, perSecond)
	}

	// The next interval counts only what happened since: nothing.
	samples, err = sampler.Sample(b.ctx)
	if err != nil || len(samples) != 1 || samples[0].Claims != 0 || samples[0].Completions != 0 ||
		samples[0].ClaimLatencyP99 != nil || !samples[0].Healthy {
		t.Fatalf("idle interval: %v %+v", err, samples)
	}

	// One sample is far from enough to decide anything.
	rep, err := ops.BrokerReadiness(b.ctx, b.pool, ops.BrokerOptions{})
	if err != nil || rep.Decision != ops.DecisionInsufficientSamples || rep.Samples != 2 {
		t.Fatalf("broker: %v %+v", err, rep)
	}
}

func TestSamplerPrunesAndReportsUnhealthyWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool, eff{queue: "stuck", typ: "t", state: "available", availableAgo: 120})
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.samples (sampled_at, queue, worker)
		VALUES (now() - interval '25 hours', 'stuck', 'old'), (now() - interval '23 hours', 'stuck', 'kept')`); err != nil {
		t.Fatal(err)
	}
	src := &fixedSource{counters: map[string]ops.QueueCounters{"stuck": {}}}
	cache := ops.NewStatsCache(b.pool, ops.StatusOptions{}, 0)
	sampler := ops.NewSampler(b.pool, cache, src, ops.SamplerConfig{Worker: "w"})
	samples, err := sampler.Sample(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing claimed while an effect waited two minutes: not healthy.
	if len(samples) != 1 || samples[0].Healthy || samples[0].OldestAvailableAge < 120*time.Second {
		t.Fatalf("%+v", samples)
	}
	var workers []string
	rows, err := b.pool.Query(b.ctx, `SELECT worker FROM pgoutbox.samples ORDER BY sampled_at`)
	if err == nil {
		workers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(workers) != 2 || workers[0] != "kept" || workers[1] != "w" {
		t.Fatalf("after pruning: %v %v", err, workers)
	}
}

type fixedSource struct{ counters map[string]ops.QueueCounters }

func (f *fixedSource) Read() (map[string]ops.QueueCounters, error) { return f.counters, nil }

func TestSamplerRunStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sampler := ops.NewSampler(b.pool, ops.NewStatsCache(b.pool, ops.StatusOptions{}, 0),
		&fixedSource{counters: map[string]ops.QueueCounters{}}, ops.SamplerConfig{Interval: time.Millisecond})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- sampler.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The end of Run's context never cuts a sample short: cut short, pgx
// closes the connection in the background, so the sample's statement went
// on running on the server after Run returned (a Client's Stop left a
// transaction open). The first statement of a sample is held
// (pgtest.Gate) while the context ends; it must still be sent under a live
// one.
func TestSamplerRunFinishesTheSampleInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := pgtest.NewGate(func(string) bool { return true })
	pool := g.Pool(t, b.dsn)
	sampler := ops.NewSampler(pool, ops.NewStatsCache(pool, ops.StatusOptions{}, 0),
		&fixedSource{counters: map[string]ops.QueueCounters{}}, ops.SamplerConfig{Interval: time.Millisecond})
	g.Arm()
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- sampler.Run(ctx) }()
	select {
	case <-g.Held():
	case <-b.ctx.Done():
		t.Fatal("the sampler sent no statement")
	}
	cancel()
	g.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-g.Done()
	if g.Ended() {
		t.Error("the sample in flight when Run's context ended was sent under that context")
	}
}
