package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
)

// Defaults of ConsumerConfig.
const (
	// DurableDefault starts every durable consumer's name:
	// <durable>-<queue> (NATS_DURABLE).
	DurableDefault = "pgoutbox"
	// MaxAckPendingDefault bounds the messages a queue's consumer has
	// delivered and not yet settled, including retries waiting out their
	// backoff in JetStream.
	MaxAckPendingDefault = 10000
)

// errStopped is the cancellation cause of deliveries still running when
// Stop's deadline passes.
var errStopped = errors.New("nats: consumer stopped before delivery finished")

// ConsumerConfig configures a Consumer. Zero fields take the documented
// defaults.
type ConsumerConfig struct {
	// ID names this consumer in lease_owner; default
	// "jetstream-<hostname>-<pid>-<random>".
	ID string
	// Queues to consume, with their concurrency and delivery timeout
	// (default the smaller of pgoutbox.DeliveryTimeoutDefault and half the
	// lease; QueueConfig.ClaimBatch is not used: a pull takes the free
	// slots).
	// Required; each must be one NATS subject token.
	Queues map[string]pgoutbox.QueueConfig
	// Types are the registered effect types: the same handlers as
	// in-process delivery. Their ordering choices
	// (EffectType.OrderingMovesOn) are recorded for each of Queues when the
	// consumer starts, as a Client does for its queues: the relay's claim
	// reads them.
	Types []pgoutbox.EffectType
	// Stream is the stream consumed from.
	Stream Stream
	// Retry is the retry policy; Retry.LeaseDuration is this consumer's
	// lease on an effect it delivers.
	Retry RetryPolicy
	// Durable default DurableDefault ("pgoutbox"); a queue's durable pull
	// consumer is named <Durable>-<queue>, shared by every process.
	Durable string
	// AckWait default AckWaitDefault (30 s); it must be below
	// Retry.LeaseDuration. A delivery may run longer than AckWait (up to its
	// timeout, which must be below the lease): the consumer sends JetStream
	// in-progress acks while it runs.
	AckWait time.Duration
	// MaxDeliver bounds JetStream deliveries of one message; default 4 ×
	// Retry.MaxAttempts. Deliveries that are not attempts (a message that
	// arrives while another consumer still holds the effect) count too.
	MaxDeliver int
	// MaxAckPending default MaxAckPendingDefault (10,000).
	MaxAckPending int
	// CompletionBatch is the most completions in one group commit; default
	// pgoutbox.CompletionBatchDefault (1000).
	CompletionBatch int
	// Logger default discards.
	Logger *slog.Logger
	// Registerer receives the consumer's metrics; nil registers none.
	Registerer prometheus.Registerer
	// TracerProvider makes each delivery's consumer span "process <queue>"
	// (pgoutbox.DeliverOptions.TracerProvider), continuing the trace of the
	// effect's enqueue. Default otel.GetTracerProvider(), the global
	// provider, a no-op until the application installs an SDK.
	TracerProvider trace.TracerProvider
}

// Consumer delivers relayed effects from JetStream with the registered
// handlers and records every outcome in PostgreSQL with the engine's fencing,
// dead-letter and reconciliation rules. Each queue has a durable pull
// consumer with explicit acks, its own pull loop and its own concurrency.
type Consumer struct {
	pool  *pgxpool.Pool
	js    jetstream.JetStream
	cfg   ConsumerConfig
	types map[string]pgoutbox.EffectType
	log   *slog.Logger
	hzn   time.Duration
	m     *prometheus.CounterVec

	queues []*consumerQueue

	life   *lifecycle.Lifecycle  // start, stop with grace, stop twice
	keeper *pgoutbox.LeaseKeeper // extends in-flight leases and sends in-progress acks
	commit *pgoutbox.Completer   // group-commits completions; set by Start
}

type consumerQueue struct {
	c     *Consumer
	name  string
	cfg   pgoutbox.QueueConfig
	cons  jetstream.Consumer
	slots chan struct{} // one token per free delivery slot
}

// NewConsumer validates cfg and returns a Consumer that is not yet started.
func NewConsumer(pool *pgxpool.Pool, js jetstream.JetStream, cfg ConsumerConfig) (*Consumer, error) {
	if pool == nil || js == nil {
		return nil, errors.New("nats: NewConsumer: pool and js are required")
	}
	if len(cfg.Queues) == 0 {
		return nil, errors.New("nats: ConsumerConfig.Queues is empty: name the queues to consume")
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("jetstream-%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	cfg.Stream = cfg.Stream.withDefaults()
	cfg.Retry = cfg.Retry.withDefaults()
	if cfg.Durable == "" {
		cfg.Durable = DurableDefault
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = AckWaitDefault
	}
	if cfg.MaxDeliver == 0 {
		cfg.MaxDeliver = 4 * cfg.Retry.MaxAttempts
	}
	if cfg.MaxAckPending == 0 {
		cfg.MaxAckPending = MaxAckPendingDefault
	}
	if cfg.CompletionBatch == 0 {
		cfg.CompletionBatch = pgoutbox.CompletionBatchDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.AckWait >= cfg.Retry.LeaseDuration:
		return nil, fmt.Errorf("nats: ConsumerConfig.AckWait (%s) must be below Retry.LeaseDuration (%s): "+
			"JetStream must not redeliver while the lease still protects a delivery", cfg.AckWait, cfg.Retry.LeaseDuration)
	case cfg.MaxDeliver <= cfg.Retry.MaxAttempts:
		return nil, fmt.Errorf("nats: ConsumerConfig.MaxDeliver (%d) must exceed Retry.MaxAttempts (%d)", cfg.MaxDeliver, cfg.Retry.MaxAttempts)
	case cfg.Retry.LeaseDuration < time.Second:
		return nil, fmt.Errorf("nats: ConsumerConfig.Retry.LeaseDuration must be at least 1s, got %s", cfg.Retry.LeaseDuration)
	}
	c := &Consumer{
		pool: pool, js: js, cfg: cfg, log: cfg.Logger, hzn: cfg.Retry.Horizon(),
		types: make(map[string]pgoutbox.EffectType, len(cfg.Types)),
		m: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_jetstream_deliveries_total",
			Help: "Deliveries of relayed effects by queue, effect type and outcome.",
		}, []string{"queue", "effect_type", "outcome"}),
		life:   lifecycle.New("nats: consumer"),
		keeper: pgoutbox.NewLeaseKeeper(pool, cfg.Retry.LeaseDuration, cfg.Logger),
	}
	for i, t := range cfg.Types {
		if t.Name == "" {
			return nil, fmt.Errorf("nats: ConsumerConfig.Types[%d]: set a name", i)
		}
		if n := countSet(t.Handler != nil, t.PageHandler != nil, t.TxHandler != nil); n != 1 {
			return nil, fmt.Errorf("nats: ConsumerConfig.Types[%q]: set exactly one of Handler, PageHandler and TxHandler", t.Name)
		}
		if t.PageHandler != nil && !t.ReplaySafe {
			return nil, fmt.Errorf("nats: ConsumerConfig.Types[%q]: a PageHandler's type must be ReplaySafe", t.Name)
		}
		if t.TxHandler != nil {
			t.ReplaySafe = true
		}
		c.types[t.Name] = t
	}
	for name, qc := range cfg.Queues {
		if err := checkToken(name); err != nil {
			return nil, fmt.Errorf("nats: ConsumerConfig.Queues: %q: %w", name, err)
		}
		if qc.Concurrency == 0 {
			qc.Concurrency = pgoutbox.ConcurrencyDefault
		}
		if qc.DeliveryTimeout == 0 {
			qc.DeliveryTimeout = min(pgoutbox.DeliveryTimeoutDefault, cfg.Retry.LeaseDuration/2)
		}
		if qc.Concurrency < 0 || qc.DeliveryTimeout >= cfg.Retry.LeaseDuration {
			return nil, fmt.Errorf("nats: ConsumerConfig.Queues[%q]: Concurrency must be positive and DeliveryTimeout (%s) below Retry.LeaseDuration (%s)",
				name, qc.DeliveryTimeout, cfg.Retry.LeaseDuration)
		}
		q := &consumerQueue{c: c, name: name, cfg: qc, slots: make(chan struct{}, qc.Concurrency)}
		for range qc.Concurrency {
			q.slots <- struct{}{}
		}
		c.queues = append(c.queues, q)
	}
	for _, t := range c.types {
		if t.Timeout >= cfg.Retry.LeaseDuration {
			return nil, fmt.Errorf("nats: ConsumerConfig.Types[%q].Timeout (%s) must be below Retry.LeaseDuration (%s)",
				t.Name, t.Timeout, cfg.Retry.LeaseDuration)
		}
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(c.m)
	}
	return c, nil
}

// ID returns the consumer's lease_owner.
func (c *Consumer) ID() string { return c.cfg.ID }

// Start records its types' ordering choices for its queues, checks (or
// creates) the stream, refusing to start when its duplicate window is
// shorter than the retry horizon, creates or updates each queue's durable
// pull consumer, and starts pulling.
func (c *Consumer) Start(ctx context.Context) error {
	return c.life.Start(func() error {
		names := make([]string, len(c.queues))
		for i, q := range c.queues {
			names[i] = q.name
		}
		if err := pgoutbox.RegisterOrdering(ctx, c.pool, names, c.cfg.Types, c.log); err != nil {
			return err
		}
		st, err := EnsureStream(ctx, c.js, c.cfg.Stream, c.cfg.Retry, names)
		if err != nil {
			return err
		}
		for _, q := range c.queues {
			q.cons, err = st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
				Durable:       c.cfg.Durable + "-" + q.name,
				Description:   "pgoutbox consumer of queue " + q.name,
				FilterSubject: c.cfg.Stream.queueFilter(q.name),
				DeliverPolicy: jetstream.DeliverAllPolicy,
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       c.cfg.AckWait,
				MaxDeliver:    c.cfg.MaxDeliver,
				MaxAckPending: c.cfg.MaxAckPending,
			})
			if err != nil {
				return fmt.Errorf("nats: consumer %s-%s: %w", c.cfg.Durable, q.name, err)
			}
		}
		c.commit = pgoutbox.NewCompleter(c.pool, c.cfg.CompletionBatch)
		c.life.Service(func(ctx context.Context) { c.keeper.Run(ctx, min(c.cfg.Retry.LeaseDuration, c.cfg.AckWait)/3) })
		c.life.OnStop(c.commit.Close)
		for _, q := range c.queues {
			c.life.Go(q.run)
		}
		c.log.Info("jetstream consumer started", "id", c.cfg.ID, "stream", c.cfg.Stream.Name, "queues", names,
			"ack_wait", c.cfg.AckWait, "max_deliver", c.cfg.MaxDeliver)
		return nil
	})
}

// Stop stops pulling (messages already pulled and not yet taken over are
// handed back to JetStream for immediate redelivery), lets deliveries finish until
// ctx ends, then cancels the rest: an interrupted replay-safe effect is handed
// back for immediate redelivery, an interrupted non-replay-safe one goes to
// reconciliation_required. Stop returns when every goroutine has exited.
func (c *Consumer) Stop(ctx context.Context) error {
	ran, err := c.life.Stop(ctx, errStopped)
	if err != nil {
		err = fmt.Errorf("nats: stop deadline passed, in-flight deliveries were interrupted: %w", err)
	}
	if ran {
		c.log.Info("jetstream consumer stopped", "id", c.cfg.ID)
	}
	return err
}

// run pulls continuously (the client buffers at most Concurrency messages)
// and takes each group of arrived messages over in one statement. A feeder
// takes a free slot before it asks for the next message, so a message never
// waits for a slot once it is handed over.
func (q *consumerQueue) run(ctx context.Context) {
	errWait := 100 * time.Millisecond
	var it jetstream.MessagesContext
	for {
		var err error
		it, err = q.cons.Messages(jetstream.PullMaxMessages(q.cfg.Concurrency))
		if err == nil {
			break
		}
		q.c.log.Error("jetstream pull failed", "queue", q.name, "err", err, "retry_in", errWait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(errWait):
		}
		errWait = min(errWait*2, 5*time.Second)
	}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			it.Drain() // buffered messages are still returned, and handed back
		case <-stopped:
		}
	}()
	defer close(stopped)
	// Messages queue up here while a take-over runs, so the next take-over
	// takes them all in one statement.
	ch := make(chan jetstream.Msg, q.cfg.Concurrency)
	go q.feed(ctx, it, ch)
	for m := range ch {
		group := []jetstream.Msg{m}
	drain:
		for len(group) < q.cfg.Concurrency {
			select {
			case m, ok := <-ch:
				if !ok {
					break drain
				}
				group = append(group, m)
			default:
				break drain
			}
		}
		q.process(ctx, group)
	}
}

// feed sends each pulled message, holding one slot, to ch; once ctx ends it
// hands back what the iterator still returns, and closes ch when the
// iterator is closed.
func (q *consumerQueue) feed(ctx context.Context, it jetstream.MessagesContext, ch chan<- jetstream.Msg) {
	defer close(ch)
	for {
		held := q.acquire(ctx)
		m, err := it.Next()
		if err != nil {
			if held {
				q.releaseN(1)
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			q.c.log.Warn("jetstream pull", "queue", q.name, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if !held {
			_ = m.Nak() // stopping: let another consumer have it now
			continue
		}
		ch <- m
	}
}

// acquire takes one free slot; false once ctx has ended.
func (q *consumerQueue) acquire(ctx context.Context) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-q.slots:
		return true
	}
}

func (q *consumerQueue) releaseN(n int) {
	for range n {
		q.slots <- struct{}{}
	}
}

func (q *consumerQueue) lastDelivery(m jetstream.Msg) bool {
	md, err := m.Metadata()
	return err == nil && md.NumDelivered >= uint64(q.c.cfg.MaxDeliver)
}

// process takes a group of messages over and settles those that cannot be
// delivered now. Each message holds one slot until it is settled.
func (q *consumerQueue) process(ctx context.Context, msgs []jetstream.Msg) {
	if ctx.Err() != nil {
		for _, m := range msgs {
			_ = m.Nak() // stopping: let another consumer have it now
		}
		q.releaseN(len(msgs))
		return
	}
	hs := make([]handoff.Message, 0, len(msgs))
	valid := make([]jetstream.Msg, 0, len(msgs))
	for _, m := range msgs {
		var env Envelope
		if err := json.Unmarshal(m.Data(), &env); err != nil || env.EffectID == 0 {
			q.c.log.Error("message is not a relayed effect; terminated", "queue", q.name, "subject", m.Subject(), "err", err)
			_ = m.TermWithReason("not a pgoutbox envelope")
			q.releaseN(1)
			continue
		}
		hs = append(hs, handoff.Message{ID: env.EffectID, Type: env.Type, Key: env.Key, RelayToken: env.RelayToken})
		valid = append(valid, m)
	}
	if len(hs) == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	res, err := handoff.TakeOver(fctx, q.c.pool, hs, q.c.cfg.ID, q.c.cfg.Retry.LeaseDuration)
	cancel()
	if err != nil {
		q.c.log.Error("take-over failed; messages redelivered later", "queue", q.name, "count", len(valid), "err", err)
		for _, m := range valid {
			_ = m.NakWithDelay(time.Second)
		}
		q.releaseN(len(valid))
		return
	}
	for i, r := range res {
		m, h := valid[i], hs[i]
		if r.Action == handoff.Taken {
			q.start(r.Lease, m)
			continue
		}
		q.c.m.WithLabelValues(q.name, h.Type, string(r.Action)).Inc()
		switch r.Action {
		case handoff.Settled:
			if r.State == pgoutbox.StateCompleted {
				_ = m.Ack()
			} else {
				_ = m.Term()
			}
		case handoff.Busy:
			if q.lastDelivery(m) {
				// Never leave a message undeliverable in the stream: the
				// holder records its outcome in PostgreSQL, and an effect
				// left behind is recovered there and relayed anew.
				q.c.log.Warn("last JetStream delivery while the effect is held elsewhere; message terminated",
					"effect_id", h.ID, "queue", q.name)
				_ = m.TermWithReason("max deliveries: effect held elsewhere")
			} else {
				_ = m.NakWithDelay(min(max(r.Wait+100*time.Millisecond, 100*time.Millisecond), q.c.cfg.AckWait))
			}
		case handoff.Reconciled:
			q.c.log.Error("delivery started and was never recorded; reconciliation_required, not redelivered",
				"effect_id", h.ID, "queue", q.name, "effect_type", h.Type)
			_ = m.TermWithReason("reconciliation_required")
		case handoff.Exhausted:
			q.c.log.Error("attempts exhausted; dead-lettered", "effect_id", h.ID, "queue", q.name, "effect_type", h.Type)
			_ = m.TermWithReason("dead_letter")
		default:
			q.c.log.Warn("message names no effect of this database; terminated", "effect_id", h.ID, "queue", q.name)
			_ = m.TermWithReason("no such effect")
		}
		q.releaseN(1)
	}
}

func (q *consumerQueue) start(l *handoff.Lease, m jetstream.Msg) {
	ctx, cancel := context.WithCancelCause(q.c.life.Work())
	q.c.keeper.Hold(l, cancel, func() { _ = m.InProgress() })
	q.c.life.AddDelivery()
	go func() {
		defer func() {
			q.c.keeper.Drop(l)
			cancel(nil)
			q.releaseN(1)
			q.c.life.DeliveryDone()
		}()
		q.deliver(ctx, l, m)
	}()
}

// deliver runs one delivery with the registered handler, as a Client does
// (pgoutbox.Lease.Deliver; a retry is handed back to JetStream), then
// settles the message.
func (q *consumerQueue) deliver(ctx context.Context, l *handoff.Lease, m jetstream.Msg) {
	c := q.c
	t := c.types[l.Type] // unregistered: retried, like a worker
	var nakDelay time.Duration
	opts := pgoutbox.DeliverOptions{
		Timeout: q.cfg.DeliveryTimeout, BackoffCap: c.cfg.Retry.BackoffCap, Completer: c.commit, Stopping: errStopped,
		TracerProvider: c.cfg.TracerProvider,
		HandBack: func(ctx context.Context, f pgoutbox.Failure) (bool, error) {
			if !f.Retry || l.Attempt >= l.MaxAttempts || q.lastDelivery(m) {
				// Dead letter, reconciliation, or (on the message's last
				// JetStream delivery) a retry scheduled in PostgreSQL: the
				// relay publishes the effect again when it is due.
				return false, nil
			}
			nakDelay = f.Delay
			if f.Stopping {
				nakDelay = 0
			}
			return true, handoff.HandBack(ctx, c.pool, l, c.hzn, f.Err)
		},
	}
	r, err := l.Deliver(ctx, c.pool, t, opts)
	logFields := []any{"effect_id", l.ID, "queue", l.Queue, "effect_type", l.Type, "attempt", l.Attempt}
	var rec *pgoutbox.RecordError
	outcome := string(r.Outcome)
	switch {
	case errors.Is(err, pgoutbox.ErrLeaseLost):
		outcome = string(pgoutbox.OutcomeLeaseLost)
		c.log.Warn("lease lost; nothing written", append(logFields, "err", err)...)
	case errors.As(err, &rec):
		switch rec.Op {
		case "commit":
			c.log.Error("delivered but not recorded; the lease will expire and the effect be recovered", append(logFields, "err", rec.Err)...)
			q.unrecorded(m, r.ReplaySafe)
		case "complete":
			c.log.Error("complete failed; the lease will expire and the effect be recovered", append(logFields, "err", rec.Err)...)
			q.unrecorded(m, r.ReplaySafe)
		case "reconcile":
			c.log.Error("delivered but not recorded; the lease will expire and the effect be recovered", append(logFields, "err", r.Err, "reconcile_err", rec.Err)...)
			q.unrecorded(m, false)
		case "hand back":
			c.log.Error("recording a retry failed; the lease will expire and the effect be recovered", append(logFields, "err", rec.Err)...)
		default:
			c.log.Error("recording a failed delivery failed; the lease will expire and the effect be recovered", append(logFields, "err", rec.Err)...)
		}
	case err != nil:
		c.log.Error("delivery failed", append(logFields, "err", err)...)
	case r.State == pgoutbox.StateCompleted:
		_ = m.Ack()
	case r.HandedBack:
		_ = m.NakWithDelay(nakDelay)
		c.log.Warn("delivery failed; JetStream redelivers", append(logFields, "outcome", r.Outcome, "retry_in", nakDelay, "err", r.Err)...)
	default:
		_ = m.TermWithReason(string(r.State))
		c.log.Warn("delivery failed", append(logFields, "outcome", r.Outcome, "state", r.State, "err", r.Err)...)
	}
	c.m.WithLabelValues(l.Queue, l.Type, outcome).Inc()
}

// unrecorded settles the message of a delivery whose outcome could not be
// recorded: a replay-safe effect is redelivered once its lease has expired
// and been recovered; any other is not redelivered (the sweeper routes it to
// reconciliation_required).
func (q *consumerQueue) unrecorded(m jetstream.Msg, replaySafe bool) {
	if replaySafe {
		_ = m.NakWithDelay(q.c.cfg.Retry.LeaseDuration)
		return
	}
	_ = m.TermWithReason("outcome unrecorded: reconciliation_required when the lease expires")
}

// ExtendLeases extends every in-flight lease now and sends JetStream an
// in-progress ack for its message (the extender does this periodically); a
// delivery whose lease was lost is cancelled with cause pgoutbox.ErrLeaseLost.
func (c *Consumer) ExtendLeases(ctx context.Context) { c.keeper.ExtendNow(ctx) }

// countSet is how many of set are true.
func countSet(set ...bool) int {
	n := 0
	for _, b := range set {
		if b {
			n++
		}
	}
	return n
}
