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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
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
	// RowLockLease is QueueConfig.RowLockLease ("0s": durable leases).
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
	f.DurationVar(&o.rowLock, "row-lock", 0, "QueueConfig.RowLockLease: lease by the claim transaction's row lock for up to this long (0: durable leases, the engine default)")
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
	producers, err := benchPool(ctx, dsn, int32(max(o.producers, o.latencyProducer)+1))
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

func benchPool(ctx context.Context, dsn string, conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	cfg.MaxConns = conns
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgoutbox-bench"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
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
	seq                atomic.Int64
	tty                bool
}

func (b *bencher) effect() pgoutbox.Effect {
	n := b.seq.Add(1)
	return pgoutbox.Effect{Queue: b.queue, Type: "bench.noop", Key: pgoutbox.Key(b.queue, strconv.FormatInt(n, 10)), Payload: b.payload}
}

func (b *bencher) insert(ctx context.Context, n int) error {
	effects := make([]pgoutbox.Effect, n)
	for i := range effects {
		effects[i] = b.effect()
	}
	return pgx.BeginFunc(ctx, b.producers, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, effects)
		return err
	})
}

// benchClients are the Clients working the bench queue; completed counts
// their completion events.
type benchClients struct {
	clients   []*pgoutbox.Client
	completed atomic.Int64
	stop      func()
}

func (b *bencher) start(ctx context.Context, onStart func(id int64)) (*benchClients, error) {
	bc := &benchClients{}
	handler := func(_ context.Context, d *pgoutbox.Delivery) error {
		if onStart != nil {
			onStart(d.ID)
		}
		return nil
	}
	var unsubs []func()
	var wg sync.WaitGroup
	done := make(chan struct{})
	for i := range b.o.clients {
		conc := b.o.concurrency / b.o.clients
		if i < b.o.concurrency%b.o.clients {
			conc++
		}
		c, err := pgoutbox.NewClient(b.workers, pgoutbox.Config{
			Queues:        map[string]pgoutbox.QueueConfig{b.queue: {Concurrency: max(conc, 1), ClaimBatch: min(b.o.claimBatch, max(conc, 1)), RowLockLease: b.o.rowLock, ClaimCooldown: b.o.claimCooldown}},
			Types:         []pgoutbox.EffectType{{Name: "bench.noop", ReplaySafe: true, Handler: handler}},
			Logger:        b.g.logger(),
			PruneInterval: -1,
		})
		if err != nil {
			return nil, err
		}
		events, unsub := c.Subscribe(1 << 16)
		unsubs = append(unsubs, unsub)
		wg.Go(func() {
			for {
				select {
				case e := <-events:
					if e.State == pgoutbox.StateCompleted {
						bc.completed.Add(1)
					}
				case <-done:
					return
				}
			}
		})
		bc.clients = append(bc.clients, c)
	}
	bc.stop = func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, c := range bc.clients {
			_ = c.Stop(sctx)
		}
		for _, u := range unsubs {
			u()
		}
		close(done)
		wg.Wait()
	}
	for _, c := range bc.clients {
		if err := c.Start(ctx); err != nil {
			bc.stop()
			return nil, err
		}
	}
	return bc, nil
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
	n := b.o.effects
	var inserted atomic.Int64
	lsn, err := benchLSN(ctx, b.workers)
	if err != nil {
		return benchDrain{}, err
	}
	done := b.progress("insert", func() (float64, string) {
		return float64(inserted.Load()) / float64(n), fmt.Sprintf("%d/%d effects", inserted.Load(), n)
	})
	t0 := time.Now()
	for i := 0; i < n; i += b.o.insertBatch {
		k := min(b.o.insertBatch, n-i)
		if err := b.insert(ctx, k); err != nil {
			done()
			return benchDrain{}, err
		}
		inserted.Add(int64(k))
	}
	insertDur := time.Since(t0)
	done()
	walInsert, err := benchWALSince(ctx, b.workers, lsn)
	if err != nil {
		return benchDrain{}, err
	}
	if lsn, err = benchLSN(ctx, b.workers); err != nil {
		return benchDrain{}, err
	}
	cpu0 := benchCPU()
	start := time.Now()
	bc, err := b.start(ctx, nil)
	if err != nil {
		return benchDrain{}, err
	}
	done = b.progress("drain", func() (float64, string) {
		c := bc.completed.Load()
		return float64(c) / float64(n), fmt.Sprintf("%d/%d effects, %.0f/s", c, n, float64(c)/time.Since(start).Seconds())
	})
	for bc.completed.Load() < int64(n) && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	cpu := benchCPU() - cpu0
	done()
	bc.stop()
	if err := ctx.Err(); err != nil {
		return benchDrain{}, err
	}
	walDrain, err := benchWALSince(ctx, b.workers, lsn)
	if err != nil {
		return benchDrain{}, err
	}
	return benchDrain{
		Effects: n, Seconds: elapsed.Seconds(),
		EffectsPerSecond:        float64(n) / elapsed.Seconds(),
		InsertEffectsPerSecond:  float64(n) / insertDur.Seconds(),
		WALBytesPerEffectInsert: walInsert / float64(n),
		WALBytesPerEffectDrain:  walDrain / float64(n),
		CPUSecondsPer10k:        cpu.Seconds() / float64(n) * 10000,
	}, nil
}

func (b *bencher) runSustained(ctx context.Context) (benchSustained, error) {
	bc, err := b.start(ctx, nil)
	if err != nil {
		return benchSustained{}, err
	}
	defer bc.stop()
	start := time.Now()
	pctx, cancel := context.WithDeadline(ctx, start.Add(b.o.sustained))
	defer cancel()
	done := b.progress("sustained", func() (float64, string) {
		return time.Since(start).Seconds() / b.o.sustained.Seconds(), fmt.Sprintf("%d completed", bc.completed.Load())
	})
	var inserted atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	for range b.o.producers {
		wg.Go(func() {
			for pctx.Err() == nil {
				if err := b.insert(pctx, b.o.producerBatch); err != nil {
					if pctx.Err() == nil {
						once.Do(func() { firstErr = err })
					}
					return
				}
				inserted.Add(int64(b.o.producerBatch))
			}
		})
	}
	<-pctx.Done()
	elapsed := time.Since(start)
	completed, ins := bc.completed.Load(), inserted.Load()
	wg.Wait()
	done()
	if firstErr != nil {
		return benchSustained{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return benchSustained{}, err
	}
	return benchSustained{
		Seconds:            elapsed.Seconds(),
		CompletedPerSecond: float64(completed) / elapsed.Seconds(),
		InsertedPerSecond:  float64(ins) / elapsed.Seconds(),
		Backlog:            ins - completed,
	}, nil
}

func (b *bencher) runLatency(ctx context.Context) (benchLatency, error) {
	var mu sync.Mutex
	commits, starts := map[int64]time.Time{}, map[int64]time.Time{}
	bc, err := b.start(ctx, func(id int64) {
		now := time.Now()
		mu.Lock()
		if _, ok := starts[id]; !ok {
			starts[id] = now
		}
		mu.Unlock()
	})
	if err != nil {
		return benchLatency{}, err
	}
	defer bc.stop()
	time.Sleep(500 * time.Millisecond) // LISTEN is up
	interval := time.Duration(float64(time.Second) / b.o.rate)
	total := int64(b.o.latency / interval)
	var next, produced atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	done := b.progress("latency", func() (float64, string) {
		return float64(produced.Load()) / float64(total), fmt.Sprintf("%d enqueued", produced.Load())
	})
	var wg sync.WaitGroup
	for range b.o.latencyProducer {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
				var id int64
				err := pgx.BeginFunc(ctx, b.producers, func(tx pgx.Tx) error {
					var err error
					id, err = pgoutbox.Enqueue(ctx, tx, b.effect())
					return err
				})
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				now := time.Now()
				mu.Lock()
				commits[id] = now
				mu.Unlock()
				produced.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	done()
	if firstErr != nil {
		return benchLatency{}, firstErr
	}
	deadline := time.Now().Add(30 * time.Second)
	for bc.completed.Load() < produced.Load() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	var lat []float64
	for id, c := range commits {
		if s, ok := starts[id]; ok {
			lat = append(lat, float64(s.Sub(c))/float64(time.Millisecond))
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	claimP99, err := store.ClaimLatencyP99(ctx, b.workers, b.queue)
	if err != nil {
		return benchLatency{}, err
	}
	return benchLatency{
		Rate: b.o.rate, AchievedRate: float64(produced.Load()) / elapsed.Seconds(),
		CommitToStartP50Ms: benchPercentile(lat, 0.5), CommitToStartP99Ms: benchPercentile(lat, 0.99),
		ClaimLatencyP99Ms: claimP99, DeliveriesMeasured: len(lat),
		EffectsNotDelivered: produced.Load() - bc.completed.Load(),
	}, nil
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

func benchLSN(ctx context.Context, db *pgxpool.Pool) (string, error) {
	var lsn string
	err := db.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}

func benchWALSince(ctx context.Context, db *pgxpool.Pool, lsn string) (float64, error) {
	var d float64
	err := db.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8", lsn).Scan(&d)
	return d, err
}

func benchCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchPercentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
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
