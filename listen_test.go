package pgoutbox_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

func listenerCount(t *testing.T, b *bundle) int64 {
	return b.scalar(t, `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'pgoutbox-listener' AND datname = current_database()`)
}

func noop(context.Context, *pgoutbox.Delivery) error { return nil }

// claimTracer is a pgx tracer that records when the client's LISTEN
// completed and how many claim statements (or batches) are in flight.
type claimTracer struct {
	mu       sync.Mutex
	listenAt time.Time
	inflight int
	claims   int
}

type traceKey struct{}

func (c *claimTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isClaim(d.SQL) {
		c.mu.Lock()
		c.inflight++
		c.claims++
		c.mu.Unlock()
	}
	return context.WithValue(ctx, traceKey{}, d.SQL)
}

func (c *claimTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	sql, _ := ctx.Value(traceKey{}).(string)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case isClaim(sql):
		c.inflight--
	case strings.HasPrefix(sql, "LISTEN "):
		c.listenAt = time.Now()
	}
}

// A row-lock claim (the default for replay-safe types) is sent as a batch.
type batchKey struct{}

func (c *claimTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	claim := false
	for _, q := range d.Batch.QueuedQueries {
		claim = claim || isClaim(q.SQL)
	}
	if claim {
		c.mu.Lock()
		c.inflight++
		c.claims++
		c.mu.Unlock()
	}
	return context.WithValue(ctx, batchKey{}, claim)
}

func (c *claimTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *claimTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	if claim, _ := ctx.Value(batchKey{}).(bool); claim {
		c.mu.Lock()
		c.inflight--
		c.mu.Unlock()
	}
}

// quiet reports whether the claim loop has gone to its long sleep: the
// listener's catch-up wake-up (right after LISTEN) is older than twice
// ActiveTail and no claim is in flight. From then on the loop claims again
// only when woken (a NOTIFY) or after PollInterval.
func (c *claimTracer) quiet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.listenAt.IsZero() && time.Since(c.listenAt) > 2*pgoutbox.ActiveTail && c.inflight == 0
}

// sleepingClient starts a client of queue "q" (type "t", a no-op handler)
// whose poll interval is an hour, stopped at cleanup, and returns once its
// claim loop is asleep: only a NOTIFY wakes it then. The precondition is a
// span of time (the claim loop's active tail, a constant of the code under
// test), not an interleaving: it waits for it to pass and for the loop's
// last claim to return.
func sleepingClient(t *testing.T, b *bundle) (*claimTracer, *watcher) {
	t.Helper()
	tr := &claimTracer{}
	c, err := pgoutbox.NewClient(tracedPool(t, b, tr), pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		PollInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, c)
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.waitFor(t, "the claim loop asleep", tr.quiet)
	return tr, events
}

func tracedPool(t *testing.T, b *bundle, tr pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// With an hour's poll interval, only a NOTIFY can wake the claim loop once
// its active tail after the listener's catch-up wake-up has passed: the
// effect is enqueued after that, so it completes only if notifications
// wake workers.
func TestNotifyWakesWorkers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tr, events := sleepingClient(t, b)
	tr.mu.Lock()
	before := tr.claims
	tr.mu.Unlock()
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"})[0]
	b.waitEvent(t, events, id, "completed")
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.claims <= before {
		t.Fatalf("completed without a claim after the enqueue (%d claims before, %d after)", before, tr.claims)
	}
}

// While the listener is down and cannot reconnect (the client's dialer
// refuses new connections; its pool already holds its own), only the
// polling fallback can find a new effect. Then the listener comes back.
func TestListenerTerminatedFallsBackToPolling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := pgxpool.ParseConfig(b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if refuse.Load() {
			return nil, errors.New("test: connections refused")
		}
		return dial(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	// Open every pool connection now: none can be opened while new
	// connections are refused.
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		conn, err := pool.Acquire(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Release()
	}
	c, err := pgoutbox.NewClient(pool, pgoutbox.Config{
		Queues:       map[string]pgoutbox.QueueConfig{"q": {}},
		Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
		PollInterval: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := watch(t, c)
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })
	refuse.Store(true)
	if n := b.scalar(t, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = 'pgoutbox-listener' AND datname = current_database()) t`); n != 1 {
		t.Fatalf("terminated %d listeners", n)
	}
	b.waitFor(t, "listener gone", func() bool { return listenerCount(t, b) == 0 })
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "after-terminate"})[0]
	b.waitEvent(t, events, id, "completed")
	if n := listenerCount(t, b); n != 0 {
		t.Fatalf("%d listeners while new connections were refused", n)
	}
	// And the listener comes back.
	refuse.Store(false)
	b.waitFor(t, "listener reconnected", func() bool { return listenerCount(t, b) == 1 })
	id2 := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "after-reconnect"})[0]
	b.waitEvent(t, events, id2, "completed")
}

// notifications collects the notifications a LISTENing connection receives
// until the sentinel queue's arrives. Notifications arrive in commit order,
// so once the sentinel, committed last, arrives every earlier one has.
func notifications(t *testing.T, b *bundle, listener *pgxpool.Conn, sentinel string) map[string]int {
	t.Helper()
	b.enqueue(t, pgoutbox.Effect{Queue: sentinel, Type: "t", Key: "sentinel"})
	counts := map[string]int{}
	for counts[sentinel] == 0 {
		n, err := listener.Conn().WaitForNotification(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		counts[n.Payload]++
	}
	return counts
}

func listen(t *testing.T, b *bundle) *pgxpool.Conn {
	t.Helper()
	listener, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(listener.Release)
	if _, err := listener.Exec(b.ctx, "LISTEN pgoutbox_effects"); err != nil {
		t.Fatal(err)
	}
	return listener
}

// A producer transaction left open after its enqueue does not silence
// another producer of the queue: B's commit notifies while A is still open.
// Under migration 00005's limiter A took the queue's notifier lock at its
// insert and B skipped.
func TestNotifyOpenProducerDoesNotSilenceOthers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listener := listen(t, b)
	a, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback(context.Background()) }()
	if _, err := pgoutbox.Enqueue(b.ctx, a, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "b"})
	if counts := notifications(t, b, listener, "qc"); counts["qa"] != 1 {
		t.Fatalf("%d notifications for qa from the committed producer while another is open, want 1", counts["qa"])
	}
}

// The limiter still folds: while a notification for the queue committed
// within the window (here a recorded time in the future), a producer
// skips its own; other queues are not affected, and a transaction that
// enqueues into several queues notifies each once.
func TestNotifyLimiterFoldsWithinCommittedWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listener := listen(t, b)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.notify_state (queue, notified_at)
		VALUES ('qf', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, pgoutbox.Effect{Queue: "qf", Type: "t", Key: "f"})
	// One transaction, two statements into qo and one into qp: one
	// notification each.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, e := range []pgoutbox.Effect{{Queue: "qo", Key: "o1"}, {Queue: "qp", Key: "p"}, {Queue: "qo", Key: "o2"}} {
			e.Type = "t"
			if _, err := pgoutbox.Enqueue(b.ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	counts := notifications(t, b, listener, "qc")
	if counts["qf"] != 0 || counts["qo"] != 1 || counts["qp"] != 1 {
		t.Fatalf("notifications %v: want none for qf (a committed one is within the window), 1 for qo and 1 for qp", counts)
	}
}

// An idle worker (its poll interval an hour) is woken by a producer that
// commits while another producer of the same queue is still open: the open
// transaction's notification must not stand in for the committed one's.
func TestNotifyOpenProducerStillWakesIdleWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, events := sleepingClient(t, b)
	open, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = open.Rollback(context.Background()) }()
	if _, err := pgoutbox.Enqueue(b.ctx, open, pgoutbox.Effect{Queue: "q", Type: "t", Key: "open"}); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "committed"})[0]
	b.waitEvent(t, events, id, "completed")
}
