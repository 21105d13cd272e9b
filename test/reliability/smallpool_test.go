package reliability

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Scenario 8: a connection pool of 2 under a queue of concurrency 16, with
// every path that takes a connection: claims, group-committed completions,
// completion transactions (OnComplete), internal jobs (TxHandler), delivery
// starts of a non-replay-safe type, lease extension, the sweeper. No
// deadlock (the drain finishes), never more than the pool's connections
// (plus the listener's own), no "too many clients", no lease lost.
func TestPoolOfTwoConcurrencySixteen(t *testing.T) {
	long(t)
	eachMode(t, testPoolOfTwo)
}

func testPoolOfTwo(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 4*time.Minute)
	d := newDB(t)
	d.exec(t, ctx, `CREATE TABLE public.side_effects (effect_id bigint PRIMARY KEY, via text NOT NULL)`)
	const perType = 500
	types := []string{"plain", "oncomplete", "job", typeDispatch}
	var batch []pgoutbox.Effect
	for _, typ := range types {
		for i := range perType {
			batch = append(batch, pgoutbox.Effect{Queue: "q", Type: typ, Key: typ + "-" + strconv.Itoa(i)})
		}
	}
	d.useTestStorage(t, ctx, "q")
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, batch)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pcfg, err := pgxpool.ParseConfig(d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.RuntimeParams["application_name"] = "pgoutbox-smallpool"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	var calls sync.Map // effect id → *atomic.Int64
	count := func(id int64) {
		v, _ := calls.LoadOrStore(id, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	work := func(ctx context.Context) error {
		t := time.NewTimer(2 * time.Millisecond) // a target that takes a little time
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	logs := &syncBuffer{}
	client, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues: withTestStorage(map[string]pgoutbox.QueueConfig{"q": {Concurrency: 16, DeliveryTimeout: 3 * time.Second, RowLockLease: hold}}),
		Types: []pgoutbox.EffectType{
			{Name: "plain", ReplaySafe: true, Handler: func(ctx context.Context, dl *pgoutbox.Delivery) error {
				count(dl.ID)
				return work(ctx)
			}},
			{Name: "oncomplete", ReplaySafe: true, Handler: func(ctx context.Context, dl *pgoutbox.Delivery) error {
				count(dl.ID)
				dl.OnComplete(func(ctx context.Context, tx pgx.Tx) error {
					_, err := tx.Exec(ctx, `INSERT INTO public.side_effects VALUES ($1, 'oncomplete')`, dl.ID)
					return err
				})
				return work(ctx)
			}},
			{Name: "job", TxHandler: func(ctx context.Context, tx pgx.Tx, dl *pgoutbox.Delivery) error {
				count(dl.ID)
				_, err := tx.Exec(ctx, `INSERT INTO public.side_effects VALUES ($1, 'job')`, dl.ID)
				return err
			}},
			{Name: typeDispatch, Handler: func(ctx context.Context, dl *pgoutbox.Delivery) error {
				count(dl.ID)
				return work(ctx)
			}},
		},
		Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		LeaseDuration: 5 * time.Second,
		SweepInterval: 500 * time.Millisecond,
		PollInterval:  100 * time.Millisecond,
		PruneInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(1 << 14)
	defer unsubscribe()
	t0 := time.Now()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var maxBackends int64
	total := int64(len(batch))
	waitFor(t, ctx, "the drain (a deadlock would stop it)", 20*time.Millisecond, func() bool {
		maxBackends = max(maxBackends, d.scalar(t, ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ('pgoutbox-smallpool', 'pgoutbox-listener')`))
		return d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`) == total
	})
	drain := time.Since(t0)
	d.checkStorage(t, ctx)
	stat := pool.Stat()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]int{}
	for len(events) > 0 {
		e := <-events
		outcomes[string(e.Outcome)]++
	}
	dups := 0
	calls.Range(func(_, v any) bool {
		if n := v.(*atomic.Int64).Load(); n > 1 {
			dups += int(n - 1)
		}
		return true
	})
	if side := d.scalar(t, ctx, `SELECT count(*) FROM public.side_effects`); side != 2*perType {
		t.Errorf("%d completion-transaction writes, want %d", side, 2*perType)
	}
	if maxBackends > 3 {
		t.Errorf("up to %d connections of the client at once; the pool holds 2 and the listener 1", maxBackends)
	}
	text := logs.String()
	for _, bad := range []string{"too many clients", "lease lost", "recovered expired lease", "deadlock"} {
		if strings.Contains(text, bad) {
			t.Errorf("client log mentions %q:\n%s", bad, tail2(text, 20))
		}
	}
	if dups != 0 || outcomes[string(pgoutbox.OutcomeSuccess)] != int(total) {
		t.Errorf("%d duplicate deliveries, outcomes %v; want %d successes and no duplicate", dups, outcomes, total)
	}
	waitMean := float64(stat.EmptyAcquireWaitTime().Microseconds()) / 1000 / float64(max(1, stat.EmptyAcquireCount()))
	report(t, "8 pool of 2, concurrency 16", figures{
		"lease_mode":                modeName(hold),
		"effects":                   total,
		"drain_s":                   round(drain.Seconds()),
		"effects_per_s":             round(float64(total) / drain.Seconds()),
		"max_client_backends":       maxBackends,
		"pool_max_conns":            2,
		"concurrency":               16,
		"pool_acquires":             stat.AcquireCount(),
		"pool_acquires_that_waited": stat.EmptyAcquireCount(),
		"pool_mean_acquire_wait_ms": round(waitMean),
		"outcomes":                  outcomes,
		"duplicates":                dups,
	})
}

func tail2(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
