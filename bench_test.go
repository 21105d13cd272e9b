package pgoutbox_test

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// enqueueAll writes effects in transactions of 5,000.
func enqueueAll(b *bundle, effects []pgoutbox.Effect) error {
	for start := 0; start < len(effects); start += 5000 {
		end := min(start+5000, len(effects))
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := pgoutbox.EnqueueBatch(b.ctx, tx, effects[start:end])
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkDrain measures how fast one client drains pre-inserted effects
// with a no-op handler (effects/s is reported; nothing is asserted).
// Run: go test -run '^$' -bench Drain -benchtime 1x .
func BenchmarkDrain(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_N")); err == nil {
		n = v
	}
	for _, conc := range []int{32, 256, 2000} {
		b.Run("concurrency="+strconv.Itoa(conc), func(b *testing.B) {
			var total time.Duration
			for range b.N {
				b.StopTimer()
				pool, _ := pgtest.NewPool(b)
				bb := &bundle{pool: pool, ctx: context.Background()}
				effects := make([]pgoutbox.Effect, n)
				for i := range effects {
					effects[i] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: strconv.Itoa(i), Payload: map[string]any{"pad": pad300}}
				}
				if err := enqueueAll(bb, effects); err != nil {
					b.Fatal(err)
				}
				c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
					Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: conc, ClaimBatch: min(conc, 1000)}},
					Types:  []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: noop}},
				})
				if err != nil {
					b.Fatal(err)
				}
				events, done := c.Subscribe(n + 10)
				b.StartTimer()
				start := time.Now()
				if err := c.Start(bb.ctx); err != nil {
					b.Fatal(err)
				}
				for range n {
					<-events
				}
				total += time.Since(start)
				b.StopTimer()
				done()
				_ = c.Stop(bb.ctx)
			}
			b.ReportMetric(float64(n*b.N)/total.Seconds(), "effects/s")
		})
	}
}

const pad300 = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"

// BenchmarkEnqueueBatch measures EnqueueBatch of 5,000 effects of 300 bytes
// per transaction (effects/s is reported; nothing is asserted).
// Run: go test -run '^$' -bench EnqueueBatch .
func BenchmarkEnqueueBatch(b *testing.B) {
	pool, _ := pgtest.NewPool(b)
	bb := &bundle{pool: pool, ctx: context.Background()}
	const batch = 5000
	effects := make([]pgoutbox.Effect, batch)
	b.ResetTimer()
	for i := range b.N {
		for j := range effects {
			effects[j] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: pgoutbox.Key("bench", strconv.Itoa(i), strconv.Itoa(j)),
				Payload: map[string]any{"pad": pad300}}
		}
		if err := enqueueAll(bb, effects); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "effects/s")
}

// BenchmarkOrderedDrain drains the same effects unordered, spread over
// 1,000 ordering keys, and on one key, on a cluster of its own (so that
// the WAL it reports is its own): effects/s and WAL bytes per effect, the
// enqueue included (nothing is asserted). The one-key case drains fewer
// effects (PGOUTBOX_BENCH_N / 10): it is serial by definition.
// Run: go test -run '^$' -bench OrderedDrain -benchtime 1x .
func BenchmarkOrderedDrain(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_N")); err == nil {
		n = v
	}
	cl := pgtest.NewCluster(b)
	for _, keys := range []int{0, 1000, 1} {
		b.Run("keys="+strconv.Itoa(keys), func(b *testing.B) {
			total := n
			if keys == 1 {
				total = n / 10
			}
			var elapsed time.Duration
			var wal float64
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				pool, err := pgxpool.New(ctx, cl.NewDB(b))
				if err != nil {
					b.Fatal(err)
				}
				bb := &bundle{pool: pool, ctx: ctx}
				effects := make([]pgoutbox.Effect, total)
				for i := range effects {
					effects[i] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: strconv.Itoa(i), Payload: map[string]any{"pad": pad300}}
					if keys > 0 {
						effects[i].OrderingKey = "k" + strconv.Itoa(i%keys)
					}
				}
				var lsn0, lsn1 float64
				if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&lsn0); err != nil {
					b.Fatal(err)
				}
				if err := enqueueAll(bb, effects); err != nil {
					b.Fatal(err)
				}
				c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
					Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: 32}},
					Types:  []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: noop}},
				})
				if err != nil {
					b.Fatal(err)
				}
				events, done := c.Subscribe(total + 10)
				b.StartTimer()
				start := time.Now()
				if err := c.Start(ctx); err != nil {
					b.Fatal(err)
				}
				for range total {
					<-events
				}
				elapsed += time.Since(start)
				b.StopTimer()
				done()
				_ = c.Stop(ctx)
				if err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&lsn1); err != nil {
					b.Fatal(err)
				}
				wal += (lsn1 - lsn0) / float64(total)
				pool.Close()
			}
			b.ReportMetric(float64(total*b.N)/elapsed.Seconds(), "effects/s")
			b.ReportMetric(wal/float64(b.N), "WAL-bytes/effect")
		})
	}
}

// BenchmarkHotKeyNeighbours measures what one hot ordering key with a
// backlog costs the unordered effects of its queue: PGOUTBOX_BENCH_HOT
// effects of one key (default 2,000) are enqueued first, then
// PGOUTBOX_BENCH_N unordered effects (default 20,000), and one client
// drains the queue. unordered-effects/s is the rate until the last
// unordered effect is delivered; hot-effects/s the hot key's rate until its
// last effect is delivered. hot=0 is the same queue without the hot key
// (nothing is asserted).
// Run: go test -run '^$' -bench HotKeyNeighbours -benchtime 1x .
func BenchmarkHotKeyNeighbours(b *testing.B) {
	n, hotN := 20_000, 2_000
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_N")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_HOT")); err == nil {
		hotN = v
	}
	cl := pgtest.NewCluster(b)
	for _, hot := range []int{0, hotN} {
		b.Run("hot="+strconv.Itoa(hot), func(b *testing.B) {
			var unorderedT, hotT time.Duration
			for range b.N {
				b.StopTimer()
				ctx := context.Background()
				pool, err := pgxpool.New(ctx, cl.NewDB(b))
				if err != nil {
					b.Fatal(err)
				}
				bb := &bundle{pool: pool, ctx: ctx}
				effects := make([]pgoutbox.Effect, 0, hot+n)
				for i := range hot {
					effects = append(effects, pgoutbox.Effect{Queue: "bulk", Type: "hot", Key: "h" + strconv.Itoa(i),
						Payload: map[string]any{"pad": pad300}, OrderingKey: "hot"})
				}
				for i := range n {
					effects = append(effects, pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: strconv.Itoa(i),
						Payload: map[string]any{"pad": pad300}})
				}
				if err := enqueueAll(bb, effects); err != nil {
					b.Fatal(err)
				}
				c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
					Queues: map[string]pgoutbox.QueueConfig{"bulk": {Concurrency: 32}},
					Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: noop},
						{Name: "hot", ReplaySafe: true, Handler: noop}},
				})
				if err != nil {
					b.Fatal(err)
				}
				events, done := c.Subscribe(hot + n + 10)
				b.StartTimer()
				start := time.Now()
				if err := c.Start(ctx); err != nil {
					b.Fatal(err)
				}
				var gotU, gotH int
				for gotU < n || gotH < hot {
					ev := <-events
					if ev.State != pgoutbox.StateCompleted {
						continue
					}
					if ev.Type == "hot" {
						if gotH++; gotH == hot {
							hotT += time.Since(start)
						}
					} else if gotU++; gotU == n {
						unorderedT += time.Since(start)
					}
				}
				b.StopTimer()
				done()
				_ = c.Stop(ctx)
				pool.Close()
			}
			b.ReportMetric(float64(n*b.N)/unorderedT.Seconds(), "unordered-effects/s")
			if hot > 0 {
				b.ReportMetric(float64(hot*b.N)/hotT.Seconds(), "hot-effects/s")
			}
		})
	}
}

// BenchmarkEnqueuePaths measures EnqueueBatch's two ways of sending a batch
// side by side, one transaction per batch of 300-byte effects, on one
// fresh database per size: parameter arrays (below CopyThreshold) and COPY
// into a temporary table (from CopyThreshold on), batch by batch in turn
// so that the machine's load weighs on both alike. Where copy/arrays
// crosses 1 is where CopyThreshold belongs (nothing is asserted).
// Run: go test -run '^$' -bench EnqueuePaths -benchtime 100x .
// (-benchtime counts pairs of batches; each size stops at 50,000 effects
// per path.)
func BenchmarkEnqueuePaths(b *testing.B) {
	paths := []enqueueFunc{pgoutbox.EnqueueBatchArrays, pgoutbox.EnqueueBatchCopy}
	for _, size := range []int{10, 100, 250, 500, 1000, 2000, 5000} {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) {
			pool, _ := pgtest.NewPool(b)
			ctx := context.Background()
			effects := make([]pgoutbox.Effect, size)
			payload := json.RawMessage(`{"pad":"` + pad300 + `"}`)
			var spent [2]time.Duration
			n := 0
			for i := 0; i < b.N && n < 50_000; i++ {
				for j := range paths {
					p := (i + j) % 2 // each path goes first in turn
					for k := range effects {
						effects[k] = pgoutbox.Effect{Queue: "bulk", Type: "noop",
							Key: strconv.Itoa(p) + "." + strconv.Itoa(i) + "." + strconv.Itoa(k), Payload: payload}
					}
					t0 := time.Now()
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						_, err := paths[p](ctx, tx, effects, "")
						return err
					})
					if err != nil {
						b.Fatal(err)
					}
					spent[p] += time.Since(t0)
				}
				n += size
			}
			b.ReportMetric(float64(n)/spent[0].Seconds(), "arrays_effects/s")
			b.ReportMetric(float64(n)/spent[1].Seconds(), "copy_effects/s")
			b.ReportMetric(spent[0].Seconds()/spent[1].Seconds(), "copy/arrays")
		})
	}
}

// BenchmarkSQLWorkerDrain drains pre-inserted effects the way a worker in
// another language does, one connection calling the SQL API with a no-op
// handler: pgoutbox.claim of 100 and a pgoutbox.complete per effect (what
// the TypeScript Worker calls for a type that is not replay-safe, and for
// every type before migration 00032), on a row storage queue and on a
// batch queue (whose claim moves each effect into rows first); and
// claim_batch of 100 (and of 10, the TypeScript Worker's page at its
// default concurrency) with one settle_batch per page on a batch queue.
// Reports effects/s and WAL bytes per effect, enqueue excluded (nothing is
// asserted). Run: go test -run '^$' -bench SQLWorkerDrain -benchtime 1x .
func BenchmarkSQLWorkerDrain(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_BENCH_N")); err == nil {
		n = v
	}
	for _, mode := range []string{"rows,claim", "batch,claim", "batch,claim_batch", "batch,claim_batch=10"} {
		b.Run(mode, func(b *testing.B) {
			var total time.Duration
			var wal float64
			for range b.N {
				b.StopTimer()
				pool, _ := pgtest.NewPool(b)
				bb := &bundle{pool: pool, ctx: context.Background()}
				if mode != "rows,claim" {
					if err := pgoutbox.SetStorage(bb.ctx, pool, "bulk", pgoutbox.StorageBatch); err != nil {
						b.Fatal(err)
					}
				}
				effects := make([]pgoutbox.Effect, n)
				for i := range effects {
					effects[i] = pgoutbox.Effect{Queue: "bulk", Type: "noop", Key: strconv.Itoa(i), Payload: map[string]any{"pad": pad300}}
				}
				if err := enqueueAll(bb, effects); err != nil {
					b.Fatal(err)
				}
				var lsn0 string
				if err := pool.QueryRow(bb.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn0); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				done := 0
				for done < n {
					page := map[string]int{"batch,claim_batch": 100, "batch,claim_batch=10": 10}[mode]
					got, err := sqlWorkerRound(bb, page)
					if err != nil {
						b.Fatal(err)
					}
					if got == 0 {
						b.Fatalf("nothing to claim after %d of %d", done, n)
					}
					done += got
				}
				total += time.Since(start)
				b.StopTimer()
				var bytes float64
				if err := pool.QueryRow(bb.ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8`, lsn0).Scan(&bytes); err != nil {
					b.Fatal(err)
				}
				wal += bytes
			}
			b.ReportMetric(float64(n*b.N)/total.Seconds(), "effects/s")
			b.ReportMetric(wal/float64(n*b.N), "WAL-B/effect")
		})
	}
}

// sqlWorkerRound claims effects of queue bulk through the SQL API and
// records each as delivered, returning how many it delivered: a page of
// claim_batch (page effects at most) and one settle_batch, or (page 0) up
// to 100 with pgoutbox.claim and a complete per effect.
func sqlWorkerRound(b *bundle, page int) (int, error) {
	if page > 0 {
		rows, err := b.pool.Query(b.ctx, `SELECT batch_id, batch_token, through, id
			FROM pgoutbox.claim_batch('bulk', 'bench', ARRAY['noop'], $1)`, page)
		if err != nil {
			return 0, err
		}
		var batchID, through, id int64
		var token [16]byte
		var ids []int64
		if _, err := pgx.ForEachRow(rows, []any{&batchID, &token, &through, &id}, func() error {
			ids = append(ids, id)
			return nil
		}); err != nil || len(ids) == 0 {
			return 0, err
		}
		_, err = b.pool.Exec(b.ctx, `SELECT pgoutbox.settle_batch('bulk', $1, $2, $3, 'bench', $4)`, batchID, token, through, ids)
		return len(ids), err
	}
	rows, err := b.pool.Query(b.ctx, `SELECT id, lease_token, effect_type FROM pgoutbox.claim('bulk', 'bench', 100)`)
	if err != nil {
		return 0, err
	}
	var ls []sqlLease
	var l sqlLease
	if _, err := pgx.ForEachRow(rows, []any{&l.ID, &l.Token, &l.Type}, func() error {
		ls = append(ls, l)
		return nil
	}); err != nil {
		return 0, err
	}
	for _, l := range ls {
		if _, err := b.pool.Exec(b.ctx, `SELECT pgoutbox.complete($1, $2, $3)`, l.ID, l.Token, l.Type); err != nil {
			return 0, err
		}
	}
	return len(ls), nil
}
