package nats_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

// benchN is the number of effects per benchmark run (PGOUTBOX_BENCH_N,
// default 20,000).
func benchN() int {
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_N")); err == nil && v > 0 {
		return v
	}
	return 20_000
}

func benchEffects(n int) []pgoutbox.Effect {
	effects := make([]pgoutbox.Effect, n)
	for i := range effects {
		effects[i] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: pgoutbox.Key("noop", strconv.Itoa(i)),
			Payload: map[string]any{"pad": pad300}}
	}
	return effects
}

// BenchmarkRelay measures relay throughput: pre-inserted effects claimed,
// published to an embedded JetStream (file storage) and handed over in
// PostgreSQL, reported as effects/s.
// Run: go test -run '^$' -bench . -benchtime 1x ./adapters/nats
func BenchmarkRelay(b *testing.B) {
	n := benchN()
	var total time.Duration
	for range b.N {
		b.StopTimer()
		bb := setup(b)
		bb.enqueue(b, benchEffects(n)...)
		b.StartTimer()
		start := time.Now()
		r := bb.startRelay(b, pgnats.RelayConfig{Queues: []string{"bulk"}, Batch: 1000})
		bb.waitFor(b, "every effect handed over", func() bool {
			return bb.scalar(b, `SELECT count(*) FROM pgoutbox.effects WHERE lease_owner = $1`, handoff.Owner) == int64(n)
		})
		total += time.Since(start)
		b.StopTimer()
		_ = r.Stop(context.Background())
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "effects/s")
}

// BenchmarkEndToEnd measures effects/s from pre-inserted effects to
// completed, through the relay, JetStream and a consumer with a no-op
// handler, running together in one process.
func BenchmarkEndToEnd(b *testing.B) {
	n := benchN()
	var total time.Duration
	for range b.N {
		b.StopTimer()
		bb := setup(b)
		bb.enqueue(b, benchEffects(n)...)
		b.StartTimer()
		start := time.Now()
		r := bb.startRelay(b, pgnats.RelayConfig{Queues: []string{"bulk"}, Batch: 1000})
		c := bb.startConsumer(b, pgnats.ConsumerConfig{
			Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: 256}},
			Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true,
				Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}},
		})
		bb.waitFor(b, "every effect completed", func() bool {
			return bb.scalar(b, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == int64(n)
		})
		total += time.Since(start)
		b.StopTimer()
		_ = c.Stop(context.Background())
		_ = r.Stop(context.Background())
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "effects/s")
}

const pad300 = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
