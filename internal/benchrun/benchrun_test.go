package benchrun_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestDrainCompletesEveryEffect drains a small backlog with two Clients:
// the result counts the effects, every effect of the backlog is completed
// in the database, and the runner was stopped (no effect leased).
func TestDrainCompletesEveryEffect(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	r, err := benchrun.NewPgoutbox(pool, benchrun.PgoutboxConfig{
		Queue: "bench-test", Type: "bench.noop", Payload: map[string]string{"pad": "x"},
		Concurrency: 5, Clients: 2, ClaimBatch: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var phases []string
	d, err := benchrun.Drain(ctx, pool, pool, r, benchrun.DrainConfig{
		Effects: n, InsertBatch: 70, Timeout: time.Minute,
		Progress: func(phase string, _ func() (float64, string)) func() {
			phases = append(phases, phase)
			return func() {}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if d.Effects != n || d.Elapsed <= 0 || d.WALInsert <= 0 || d.WALDrain <= 0 {
		t.Fatalf("drain result %+v", d)
	}
	if got := r.Completed().Load(); got != n {
		t.Fatalf("completed events %d, want %d", got, n)
	}
	var completed, all int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE state = 'completed'), count(*)
		FROM pgoutbox.effects WHERE queue = 'bench-test'`).Scan(&completed, &all); err != nil {
		t.Fatal(err)
	}
	if completed != n || all != n {
		t.Fatalf("database: %d of %d completed, want %d of %d", completed, all, n, n)
	}
	if len(phases) != 2 || phases[0] != "insert" || phases[1] != "drain" {
		t.Fatalf("progress phases %v", phases)
	}
}

// TestDrainBatchStorage drains a backlog of a batch-storage queue: with the
// storage recorded before the backlog is enqueued, every effect goes to
// the stream, is delivered from its batches and writes no row of its own
// in pgoutbox.effects; each is delivered once.
func TestDrainBatchStorage(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	var mu sync.Mutex
	deliveries := map[int64]int{}
	r, err := benchrun.NewPgoutbox(pool, benchrun.PgoutboxConfig{
		Queue: "bench-batch", Type: "bench.noop", Payload: map[string]string{"pad": "x"},
		Concurrency: 5, Storage: pgoutbox.StorageBatch, PageSize: 40,
		OnStart: func(id int64) {
			mu.Lock()
			deliveries[id]++
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RecordStorage(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const n = 300
	if _, err := benchrun.Drain(ctx, pool, pool, r, benchrun.DrainConfig{Effects: n, InsertBatch: 70, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := r.Completed().Load(); got != n {
		t.Fatalf("completed events %d, want %d", got, n)
	}
	var streamed, rows, open int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgoutbox.stream WHERE queue = 'bench-batch'),
		(SELECT count(*) FROM pgoutbox.effects WHERE queue = 'bench-batch'),
		(SELECT count(*) FROM pgoutbox.stream_batches WHERE queue = 'bench-batch' AND done_at IS NULL)`).Scan(&streamed, &rows, &open); err != nil {
		t.Fatal(err)
	}
	if streamed != n || rows != 0 || open != 0 {
		t.Fatalf("database: %d streamed, %d rows, %d open batches; want %d, 0, 0", streamed, rows, open, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(deliveries) != n {
		t.Fatalf("%d effects delivered, want %d", len(deliveries), n)
	}
	for id, k := range deliveries {
		if k != 1 {
			t.Fatalf("effect %d delivered %d times", id, k)
		}
	}
}

// TestCounterWait: Wait returns true once the target is reached, false when
// the context ends first.
func TestCounterWait(t *testing.T) {
	var c benchrun.Counter
	c.Add(2)
	if !c.Wait(context.Background(), 2, 0) {
		t.Fatal("Wait on a reached target returned false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c.Wait(ctx, 3, 0) {
		t.Fatal("Wait on an unreached target with an ended context returned true")
	}
	go c.Add(1)
	if !c.Wait(context.Background(), 3, 0) {
		t.Fatal("Wait did not see the count reach its target")
	}
}

func TestPercentile(t *testing.T) {
	if v := benchrun.Percentile(nil, 0.5); !math.IsNaN(v) {
		t.Fatalf("Percentile(nil) = %v, want NaN", v)
	}
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if p50, p99 := benchrun.Percentile(xs, 0.5), benchrun.Percentile(xs, 0.99); p50 != 5 || p99 != 10 {
		t.Fatalf("p50 %v p99 %v, want 5 and 10", p50, p99)
	}
}

// TestLatencyMeasuresOnlyAfterTheWarmUp: the warm-up effects (one per
// producer connection, then a paced run) are completed and counted apart;
// the measured effects are exactly the ones produced afterwards, all with
// larger ids, each with a commit time and a delivery start.
func TestLatencyMeasuresOnlyAfterTheWarmUp(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	ctx := context.Background()
	starts := benchrun.NewStamps()
	r, err := benchrun.NewPgoutbox(pool, benchrun.PgoutboxConfig{
		Queue: "bench-latency", Type: "bench.noop", Payload: map[string]string{"pad": "x"},
		Concurrency: 10, Clients: 1,
		OnStart: func(id int64) { starts.Set(id, time.Now(), true) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop(context.Background()) }()
	const producers = 3
	l, err := benchrun.Latency(ctx, pool, r, starts, benchrun.LatencyConfig{
		Rate: 200, Duration: 250 * time.Millisecond, WarmUp: 100 * time.Millisecond,
		Producers: producers, Wait: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !l.Completed || l.Produced == 0 || l.Warm <= producers || l.WarmMaxID <= 0 {
		t.Fatalf("latency result: completed %v, produced %d, warm %d, warm max id %d; want all completed, some produced, more than %d warm",
			l.Completed, l.Produced, l.Warm, l.WarmMaxID, producers)
	}
	if got := r.Completed().Load(); got != l.Warm+l.Produced {
		t.Fatalf("completed %d, want warm %d + produced %d", got, l.Warm, l.Produced)
	}
	var measured, warm int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE id > $1), count(*) FILTER (WHERE id <= $1)
		FROM pgoutbox.effects WHERE queue = 'bench-latency' AND state = 'completed'`, l.WarmMaxID).Scan(&measured, &warm); err != nil {
		t.Fatal(err)
	}
	if measured != l.Produced || warm != l.Warm {
		t.Fatalf("database: %d effects above the warm-up's ids and %d at or below, want %d and %d", measured, warm, l.Produced, l.Warm)
	}
	if int64(len(l.StartMs)) != l.Produced {
		t.Fatalf("%d commit -> start latencies, want one per measured effect (%d)", len(l.StartMs), l.Produced)
	}
	for id := l.WarmMaxID - l.Warm + 1; id <= l.WarmMaxID; id++ {
		if _, ok := l.Commits.Get(id); ok {
			t.Fatalf("warm-up effect %d is among the measured commits", id)
		}
	}
}
