package cli

// pgoutbox bench: the pgoutbox half of the side-by-side benchmark (bench/,
// docs/benchmarks.md) against the operator's own database, so they can size
// it. It works a dedicated queue named pgoutbox-bench-<random>, which no
// other worker claims, and deletes that queue's rows when it ends.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/benchrun"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

type benchOptions struct {
	effects         int
	payloadBytes    int
	insertBatch     int
	concurrency     int
	claimBatch      int
	clients         int
	rowLock         time.Duration
	claimCooldown   time.Duration
	sustained       time.Duration
	producers       int
	producerBatch   int
	rate            float64
	latency         time.Duration
	latencyProducer int
	asJSON          bool
}

// benchReport is what --json prints.
type benchReport struct {
	Queue     string          `json:"queue"`
	Config    benchConfig     `json:"config"`
	Drain     benchDrain      `json:"drain"`
	Sustained *benchSustained `json:"sustained,omitempty"`
	Latency   *benchLatency   `json:"latency,omitempty"`
}

type benchConfig struct {
	Effects      int `json:"effects"`
	PayloadBytes int `json:"payload_bytes"`
	Concurrency  int `json:"concurrency"`
	ClaimBatch   int `json:"claim_batch"`
	Clients      int `json:"clients"`
	// RowLockLease is the --row-lock flag (QueueConfig.RowLockLease; "0s":
	// durable leases).
	RowLockLease string `json:"row_lock_lease"`
	// ClaimCooldown is QueueConfig.ClaimCooldown ("0s": none).
	ClaimCooldown string `json:"claim_cooldown"`
}

type benchDrain struct {
	Effects                int     `json:"effects"`
	Seconds                float64 `json:"seconds"`
	EffectsPerSecond       float64 `json:"effects_per_second"`
	InsertEffectsPerSecond float64 `json:"insert_effects_per_second"`
	// WAL is server-wide: other traffic on the server is counted too.
	WALBytesPerEffectInsert float64 `json:"wal_bytes_per_effect_insert"`
	WALBytesPerEffectDrain  float64 `json:"wal_bytes_per_effect_drain"`
	CPUSecondsPer10k        float64 `json:"cpu_seconds_per_10k_effects_process"`
}

type benchSustained struct {
	Seconds            float64 `json:"seconds"`
	CompletedPerSecond float64 `json:"completed_per_second"`
	InsertedPerSecond  float64 `json:"inserted_per_second"`
	Backlog            int64   `json:"backlog"`
}

type benchLatency struct {
	Rate                float64 `json:"rate"`
	AchievedRate        float64 `json:"achieved_rate"`
	CommitToStartP50Ms  float64 `json:"commit_to_delivery_start_p50_ms"`
	CommitToStartP99Ms  float64 `json:"commit_to_delivery_start_p99_ms"`
	ClaimLatencyP99Ms   float64 `json:"claim_latency_p99_ms"`
	DeliveriesMeasured  int     `json:"deliveries_measured"`
	EffectsNotDelivered int64   `json:"effects_not_delivered"`
}

func newBenchCmd(g *globals) *cobra.Command {
	o := &benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure pgoutbox's throughput and latency on this database",
		Long: `bench enqueues and drains effects with a no-op handler on a dedicated queue
(pgoutbox-bench-<random>) of the database, then deletes that queue's rows:
  drain      --effects pre-inserted, time to complete them all (effects/s)
  sustained  producers enqueue as fast as the database accepts for --sustained
  latency    --rate effects/s, one per transaction, for --latency: commit ->
             delivery start p50/p99 and claim latency p99
Migrations are applied first. WAL figures are server-wide. The comparison
with River is the bench/ module (docs/benchmarks.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.effects, "effects", 100_000, "drain: effects pre-inserted")
	f.IntVar(&o.payloadBytes, "payload-bytes", 300, "JSON payload size of every effect")
	f.IntVar(&o.insertBatch, "insert-batch", 5000, "effects per insert transaction of the backlog")
	f.IntVar(&o.concurrency, "concurrency", 2000, "deliveries in flight (QueueConfig.Concurrency, split between --clients)")
	f.IntVar(&o.claimBatch, "claim-batch", 500, "QueueConfig.ClaimBatch")
	f.IntVar(&o.clients, "clients", 2, "Clients on the queue in this process (each has its own claim loop)")
	f.DurationVar(&o.rowLock, "row-lock", pgoutbox.RowLockLeaseDefault, "QueueConfig.RowLockLease: lease replay-safe effects by the claim transaction's row lock for up to this long (the engine default; 0: durable leases)")
	f.DurationVar(&o.claimCooldown, "claim-cooldown", 0, "QueueConfig.ClaimCooldown: wait up to this long after a claim for more free slots before claiming a partial batch (0: none, the engine default)")
	f.DurationVar(&o.sustained, "sustained", 10*time.Second, "sustained: how long producers enqueue (0 skips)")
	f.IntVar(&o.producers, "producers", 4, "sustained: producer connections")
	f.IntVar(&o.producerBatch, "producer-batch", 100, "sustained: effects per producer transaction")
	f.Float64Var(&o.rate, "rate", 1000, "latency: effects/s, one effect per transaction")
	f.DurationVar(&o.latency, "latency", 10*time.Second, "latency: how long to produce (0 skips)")
	f.IntVar(&o.latencyProducer, "latency-producers", 16, "latency: concurrent producer connections")
	f.BoolVar(&o.asJSON, "json", false, "print the figures as JSON (drain throughput: drain.effects_per_second)")
	return cmd
}

func runBench(ctx context.Context, g *globals, o *benchOptions) error {
	if o.effects < 1 || o.payloadBytes < 10 || o.payloadBytes > pgoutbox.MaxPayloadBytes || o.insertBatch < 1 ||
		o.concurrency < 1 || o.claimBatch < 1 || o.clients < 1 || o.producers < 1 || o.producerBatch < 1 ||
		o.rate <= 0 || o.latencyProducer < 1 || o.sustained < 0 || o.latency < 0 || o.rowLock < 0 || o.claimCooldown < 0 {
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("bench: every size must be positive and no duration negative, --payload-bytes between 10 and %d", pgoutbox.MaxPayloadBytes)}
	}
	pool, dsn, err := g.open(ctx, true)
	if err != nil {
		return err
	}
	pool.Close()
	// Workers and producers get their own pools, as an application would.
	workers, err := benchPool(ctx, dsn, 10)
	if err != nil {
		return err
	}
	defer workers.Close()
	producers, err := benchPool(ctx, dsn, max(o.producers, o.latencyProducer)+1)
	if err != nil {
		return err
	}
	defer producers.Close()

	b := &bencher{o: o, g: g, workers: workers, producers: producers,
		queue:   fmt.Sprintf("pgoutbox-bench-%08x", rand.Uint32()),
		payload: json.RawMessage(`{"pad":"` + strings.Repeat("x", o.payloadBytes-10) + `"}`),
		tty:     benchIsTerminal(g.stderr) && !o.asJSON,
	}
	defer b.cleanup()
	rep := &benchReport{Queue: b.queue, Config: benchConfig{
		Effects: o.effects, PayloadBytes: o.payloadBytes, Concurrency: o.concurrency, ClaimBatch: o.claimBatch, Clients: o.clients,
		RowLockLease: o.rowLock.String(), ClaimCooldown: o.claimCooldown.String(),
	}}
	if rep.Drain, err = b.drain(ctx); err != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("bench drain: %w", err)}
	}
	if o.sustained > 0 {
		b.cleanup()
		s, err := b.runSustained(ctx)
		if err != nil {
			return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("bench sustained: %w", err)}
		}
		rep.Sustained = &s
	}
	if o.latency > 0 {
		b.cleanup()
		l, err := b.runLatency(ctx)
		if err != nil {
			return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("bench latency: %w", err)}
		}
		rep.Latency = &l
	}
	if o.asJSON {
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printBench(g.stdout, rep)
	return nil
}

func benchPool(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, error) {
	pool, err := benchrun.OpenPool(ctx, dsn, conns)
	if err != nil {
		return nil, &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	return pool, nil
}

type bencher struct {
	o                  *benchOptions
	g                  *globals
	workers, producers *pgxpool.Pool
	queue              string
	payload            json.RawMessage
	tty                bool
}

// runner builds the Clients working the bench queue (not started); onStart,
// when set, is called at the start of every delivery.
func (b *bencher) runner(onStart func(id int64)) (*benchrun.Pgoutbox, error) {
	return benchrun.NewPgoutbox(b.workers, benchrun.PgoutboxConfig{
		Queue: b.queue, Type: "bench.noop", Payload: b.payload,
		Concurrency: b.o.concurrency, Clients: b.o.clients, ClaimBatch: b.o.claimBatch,
		RowLockLease: rowLockLease(b.o.rowLock), ClaimCooldown: b.o.claimCooldown,
		OnStart: onStart, Logger: b.g.logger(),
	})
}

// progress draws a bar on a terminal, or prints the phase once elsewhere.
func (b *bencher) progress(phase string, frac func() (float64, string)) func() {
	if !b.tty {
		if !b.o.asJSON {
			fmt.Fprintf(b.g.stderr, "%s…\n", phase)
		}
		return func() {}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	draw := func() {
		f, note := frac()
		f = math.Max(0, math.Min(1, f))
		const width = 30
		n := int(f * width)
		fmt.Fprintf(b.g.stderr, "\r%-10s [%s%s] %3.0f%% %s\033[K", phase, strings.Repeat("#", n), strings.Repeat(".", width-n), f*100, note)
	}
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				draw()
				fmt.Fprintln(b.g.stderr)
				return
			case <-t.C:
				draw()
			}
		}
	})
	return func() { close(stop); wg.Wait() }
}

func (b *bencher) drain(ctx context.Context) (benchDrain, error) {
	r, err := b.runner(nil)
	if err != nil {
		return benchDrain{}, err
	}
	d, err := benchrun.Drain(ctx, b.workers, b.producers, r, benchrun.DrainConfig{
		Effects: b.o.effects, InsertBatch: b.o.insertBatch, Progress: b.progress,
	})
	if err != nil {
		return benchDrain{}, err
	}
	n := float64(d.Effects)
	return benchDrain{
		Effects: d.Effects, Seconds: d.Elapsed.Seconds(),
		EffectsPerSecond:        n / d.Elapsed.Seconds(),
		InsertEffectsPerSecond:  n / d.Insert.Seconds(),
		WALBytesPerEffectInsert: d.WALInsert / n,
		WALBytesPerEffectDrain:  d.WALDrain / n,
		CPUSecondsPer10k:        d.CPU.Seconds() / n * 10000,
	}, nil
}

func (b *bencher) runSustained(ctx context.Context) (benchSustained, error) {
	r, err := b.runner(nil)
	if err != nil {
		return benchSustained{}, err
	}
	if err := r.Start(ctx); err != nil {
		return benchSustained{}, err
	}
	defer b.stop(ctx, r)
	s, err := benchrun.Sustained(ctx, b.producers, r, benchrun.SustainedConfig{
		Duration: b.o.sustained, Producers: b.o.producers, ProducerBatch: b.o.producerBatch, Progress: b.progress,
	})
	if err != nil {
		return benchSustained{}, err
	}
	return benchSustained{
		Seconds:            s.Elapsed.Seconds(),
		CompletedPerSecond: float64(s.Completed) / s.Elapsed.Seconds(),
		InsertedPerSecond:  float64(s.Inserted) / s.Elapsed.Seconds(),
		Backlog:            s.Inserted - s.Completed,
	}, nil
}

func (b *bencher) runLatency(ctx context.Context) (benchLatency, error) {
	starts := benchrun.NewStamps()
	r, err := b.runner(func(id int64) { starts.Set(id, time.Now(), true) })
	if err != nil {
		return benchLatency{}, err
	}
	if err := r.Start(ctx); err != nil {
		return benchLatency{}, err
	}
	defer b.stop(ctx, r)
	l, err := benchrun.Latency(ctx, b.producers, r, starts, benchrun.LatencyConfig{
		Rate: b.o.rate, Duration: b.o.latency, Producers: b.o.latencyProducer,
		Settle: 500 * time.Millisecond, WarmUp: time.Second, Wait: 30 * time.Second, Progress: b.progress,
	})
	if err != nil {
		return benchLatency{}, err
	}
	claimP99, err := store.ClaimLatencyP99(ctx, b.workers, b.queue, l.WarmMaxID)
	if err != nil {
		return benchLatency{}, err
	}
	return benchLatency{
		Rate: b.o.rate, AchievedRate: float64(l.Produced) / l.Elapsed.Seconds(),
		CommitToStartP50Ms: benchPercentile(l.StartMs, 0.5), CommitToStartP99Ms: benchPercentile(l.StartMs, 0.99),
		ClaimLatencyP99Ms: claimP99, DeliveriesMeasured: len(l.StartMs),
		EffectsNotDelivered: l.Produced + l.Warm - r.Completed().Load(),
	}, nil
}

// stop stops the bench Clients, giving them 30s even when ctx has ended.
func (b *bencher) stop(ctx context.Context, r benchrun.Runner) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), benchrun.StopTimeout)
	defer cancel()
	_ = r.Stop(sctx)
}

// cleanup deletes the bench queue's rows in small batches: its effects,
// then its idempotency keys (which outlive their effects, migration 00007).
// Only this command's own queue (pgoutbox-bench-<random>) is touched.
func (b *bencher) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := store.PurgeQueue(ctx, b.workers, b.queue, 5000); err != nil {
		fmt.Fprintf(b.g.stderr, "pgoutbox bench: cleanup of queue %s failed: %v\n", b.queue, err)
	}
}

// benchPercentile is benchrun.Percentile with 0 for no values (JSON has no
// NaN).
func benchPercentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return benchrun.Percentile(sorted, q)
}

func benchIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func printBench(w io.Writer, r *benchReport) {
	fmt.Fprintf(w, "pgoutbox bench: %d effects of %d bytes, concurrency %d, claim batch %d, %d client(s), row-lock lease %s, claim cooldown %s\n\n",
		r.Config.Effects, r.Config.PayloadBytes, r.Config.Concurrency, r.Config.ClaimBatch, r.Config.Clients, r.Config.RowLockLease, r.Config.ClaimCooldown)
	d := r.Drain
	fmt.Fprintf(w, "drain       %8.0f effects/s (%.1fs; backlog inserted at %.0f effects/s)\n", d.EffectsPerSecond, d.Seconds, d.InsertEffectsPerSecond)
	fmt.Fprintf(w, "            WAL %.0f B/effect insert + %.0f B/effect claim+complete (server-wide); CPU %.2f s/10k effects (this process)\n",
		d.WALBytesPerEffectInsert, d.WALBytesPerEffectDrain, d.CPUSecondsPer10k)
	if s := r.Sustained; s != nil {
		fmt.Fprintf(w, "sustained   %8.0f completed/s, %.0f inserted/s, backlog %d after %.0fs\n", s.CompletedPerSecond, s.InsertedPerSecond, s.Backlog, s.Seconds)
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "latency     at %.0f/s (achieved %.0f/s): commit -> delivery start p50 %.1f ms, p99 %.1f ms; claim latency p99 %.1f ms\n",
			l.Rate, l.AchievedRate, l.CommitToStartP50Ms, l.CommitToStartP99Ms, l.ClaimLatencyP99Ms)
		if l.EffectsNotDelivered > 0 {
			fmt.Fprintf(w, "            %d effects were not delivered within 30s of the last enqueue\n", l.EffectsNotDelivered)
		}
	}
}
