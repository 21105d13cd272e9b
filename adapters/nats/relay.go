package nats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
	"github.com/pgoutbox/pgoutbox/internal/lifecycle"
)

// Defaults of RelayConfig.
// HandoffOwner is the lease_owner of an effect the relay handed to JetStream
// (or a consumer handed back for a retry): it waits in the stream for a
// consumer to take it over (docs/scale-out.md). `pgoutbox status` counts it
// as leased.
const HandoffOwner = handoff.Owner

const (
	// RelayBatchDefault is the most effects one relay claim takes and
	// publishes before handing them over together.
	RelayBatchDefault = 500
	// RelayConcurrencyDefault is the number of batches of one queue in
	// flight at once: claims, publishes and hand-overs of different batches
	// overlap.
	RelayConcurrencyDefault = 2
	// RelayLeaseDefault is the relay's lease on a claimed batch: publishing
	// and handing over must finish within it.
	RelayLeaseDefault = 30 * time.Second
	// PublishTimeoutDefault bounds the wait for one batch's publish acks.
	PublishTimeoutDefault = 10 * time.Second
)

// RelayConfig configures a Relay. Zero fields take the documented defaults.
type RelayConfig struct {
	// ID names the relay in lease_owner; default "relay-<hostname>-<pid>-<random>".
	ID string
	// Queues are the queues whose effects are relayed. Required; each must
	// be one NATS subject token.
	Queues []string
	// Types are the effect types whose ordering choices
	// (EffectType.OrderingMovesOn; nothing else of them is read) the relay
	// records for each of its queues when it starts
	// (pgoutbox.RegisterOrdering), as a Client does for its queues: the
	// relay's claim reads them. Default none: the consumers of the queues
	// record their types' choices when they start (ConsumerConfig.Types).
	Types []pgoutbox.EffectType
	// Stream is the stream relayed to.
	Stream Stream
	// Retry is the consumers' retry policy; its horizon is the hand-over
	// lease and the least duplicate window the stream may have.
	Retry RetryPolicy
	// Batch default RelayBatchDefault (500). Batch × Concurrency × the
	// number of queues should stay below the JetStream client's limit of
	// async publishes in flight (jetstream.WithPublishAsyncMaxPending, 4,000
	// by default): beyond it publishes stall, fail, and are released to be
	// relayed again.
	Batch int
	// Concurrency default RelayConcurrencyDefault (2): relay loops per
	// queue, each claiming its own batch (SKIP LOCKED).
	Concurrency int
	// Lease default RelayLeaseDefault (30 s).
	Lease time.Duration
	// PublishTimeout default PublishTimeoutDefault (10 s); below Lease.
	PublishTimeout time.Duration
	// PollInterval default pgoutbox.PollIntervalDefault (1 s): the polling
	// fallback when no NOTIFY arrives.
	PollInterval time.Duration
	// DisableListen turns LISTEN/NOTIFY off (polling only).
	DisableListen bool
	// HeartbeatInterval is how often the relay upserts its row in
	// pgoutbox.workers (the live workers: its queues, Concurrency each),
	// like a Client with queues; deleted at Stop. Default
	// pgoutbox.HeartbeatIntervalDefault (10 s); negative disables it.
	HeartbeatInterval time.Duration
	// Logger default discards.
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil registers none.
	Registerer prometheus.Registerer
	// AfterPublish, when set, is called with the number of effects whose
	// publish a batch had acknowledged, before they are handed over in
	// PostgreSQL (instrumentation and crash tests).
	AfterPublish func(acked int)
}

// Relay moves the effects of chosen queues from PostgreSQL into a JetStream
// stream: it claims a batch (without counting a delivery attempt), publishes
// each effect's Envelope to <prefix>.<queue>.<effect_type> with Nats-Msg-Id =
// the idempotency key, waits for the acks, and hands the acknowledged effects
// over in one fenced statement. See the package documentation for what each
// failure does.
type Relay struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	stream  jetstream.Stream
	cfg     RelayConfig
	horizon time.Duration
	log     *slog.Logger
	m       relayMetrics

	life *lifecycle.Lifecycle // start, stop with grace, stop twice
	wake map[string]chan struct{}
}

type relayMetrics struct {
	published, duplicates, failed *prometheus.CounterVec
}

// NewRelay validates cfg and returns a Relay that is not yet started.
func NewRelay(pool *pgxpool.Pool, js jetstream.JetStream, cfg RelayConfig) (*Relay, error) {
	if pool == nil || js == nil {
		return nil, errors.New("nats: NewRelay: pool and js are required")
	}
	if len(cfg.Queues) == 0 {
		return nil, errors.New("nats: RelayConfig.Queues is empty: name the queues to relay")
	}
	if cfg.ID == "" {
		host, _ := os.Hostname()
		cfg.ID = fmt.Sprintf("relay-%s-%d-%04x", host, os.Getpid(), rand.IntN(1<<16))
	}
	if cfg.Batch == 0 {
		cfg.Batch = RelayBatchDefault
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = RelayConcurrencyDefault
	}
	if cfg.Lease == 0 {
		cfg.Lease = RelayLeaseDefault
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = PublishTimeoutDefault
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = pgoutbox.PollIntervalDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = pgoutbox.HeartbeatIntervalDefault
	}
	switch {
	case cfg.Batch < 0 || cfg.Concurrency < 0:
		return nil, errors.New("nats: RelayConfig.Batch and RelayConfig.Concurrency must be positive")
	case cfg.PublishTimeout >= cfg.Lease:
		return nil, fmt.Errorf("nats: RelayConfig.PublishTimeout (%s) must be below RelayConfig.Lease (%s)", cfg.PublishTimeout, cfg.Lease)
	}
	cfg.Stream = cfg.Stream.withDefaults()
	cfg.Retry = cfg.Retry.withDefaults()
	r := &Relay{pool: pool, js: js, cfg: cfg, horizon: cfg.Retry.Horizon(), log: cfg.Logger, wake: map[string]chan struct{}{},
		life: lifecycle.New("nats: relay")}
	for _, q := range cfg.Queues {
		if err := checkToken(q); err != nil {
			return nil, fmt.Errorf("nats: RelayConfig.Queues: %q: %w", q, err)
		}
		r.wake[q] = make(chan struct{}, 1)
	}
	r.m = relayMetrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_relay_published_total", Help: "Effects published to JetStream and handed over, by queue.",
		}, []string{"queue"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_relay_duplicates_total", Help: "Relay publishes JetStream acknowledged as duplicates, by queue.",
		}, []string{"queue"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgoutbox_relay_publish_failures_total", Help: "Relay publishes that failed, by queue.",
		}, []string{"queue"}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(r.m.published, r.m.duplicates, r.m.failed)
	}
	return r, nil
}

// ID returns the relay's lease_owner.
func (r *Relay) ID() string { return r.cfg.ID }

// Start records the ordering choices of RelayConfig.Types for its queues,
// checks (or creates) the stream, refusing to start when its duplicate
// window is shorter than the retry horizon, then starts one relay loop per
// queue and the LISTEN/NOTIFY listener.
func (r *Relay) Start(ctx context.Context) error {
	return r.life.Start(func() error {
		if err := pgoutbox.RegisterOrdering(ctx, r.pool, r.cfg.Queues, r.cfg.Types, r.log); err != nil {
			return err
		}
		st, err := EnsureStream(ctx, r.js, r.cfg.Stream, r.cfg.Retry, r.cfg.Queues)
		if err != nil {
			return err
		}
		r.stream = st
		if r.cfg.HeartbeatInterval > 0 {
			queues := slices.Sorted(slices.Values(r.cfg.Queues))
			conc := make([]int32, len(queues))
			for i := range conc {
				conc[i] = int32(r.cfg.Concurrency)
			}
			hb := &pgoutbox.WorkerHeartbeat{Pool: r.pool, ID: r.cfg.ID, Interval: r.cfg.HeartbeatInterval, Log: r.log, Started: time.Now(),
				Queues: func() ([]string, []int32, int) { return queues, conc, 0 }}
			r.life.Service(hb.Run)
		}
		for _, q := range r.cfg.Queues {
			for range r.cfg.Concurrency {
				r.life.Go(func(ctx context.Context) { r.loop(ctx, q) })
			}
		}
		if !r.cfg.DisableListen {
			cfg := r.pool.Config().ConnConfig.Copy()
			cfg.RuntimeParams["application_name"] = "pgoutbox-relay-listener"
			l := &pgoutbox.EnqueueListener{
				Config: cfg, RetryMax: 5 * time.Second, Log: r.log,
				Wake: func(queue string) {
					if ch, ok := r.wake[queue]; ok {
						signal(ch)
					}
				},
				WakeAll: func() {
					for _, ch := range r.wake {
						signal(ch)
					}
				},
			}
			r.life.Go(l.Run)
		}
		r.log.Info("relay started", "id", r.cfg.ID, "stream", r.cfg.Stream.Name, "queues", r.cfg.Queues,
			"handover_lease", r.horizon)
		return nil
	})
}

// Stop stops claiming and waits for the batch in flight to be handed over
// (or ctx to end). Effects claimed and not handed over are recovered by the
// sweeper when the relay's lease expires.
func (r *Relay) Stop(ctx context.Context) error {
	ran, err := r.life.Stop(ctx, nil)
	if err == nil && ran {
		err = ctx.Err() // the batch in flight outlived ctx
	}
	if ran && err == nil {
		r.log.Info("relay stopped", "id", r.cfg.ID)
	}
	return err
}

func (r *Relay) loop(ctx context.Context, queue string) {
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	errWait := 100 * time.Millisecond
	for ctx.Err() == nil {
		n, err := r.RelayBatch(ctx, queue)
		if err != nil && ctx.Err() == nil {
			r.log.Error("relay batch failed", "queue", queue, "err", err, "retry_in", errWait)
			select {
			case <-ctx.Done():
			case <-time.After(errWait):
			}
			errWait = min(errWait*2, 5*time.Second)
			continue
		}
		errWait = 100 * time.Millisecond
		if n == r.cfg.Batch {
			continue // a full batch: there may be more
		}
		poll.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-r.wake[queue]:
		case <-poll.C:
		}
	}
}

// RelayBatch relays one batch of queue (the loops started by Start call it
// repeatedly) and returns how many effects it claimed.
func (r *Relay) RelayBatch(ctx context.Context, queue string) (int, error) {
	leases, err := handoff.ClaimRelay(ctx, r.pool, queue, r.cfg.ID, r.cfg.Batch, r.cfg.Lease)
	if err != nil || len(leases) == 0 {
		return 0, err
	}

	// From here the batch is finished even when ctx ends: what was
	// published is handed over.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Lease)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, len(leases))
	errs := make([]error, len(leases))
	for i, l := range leases {
		msg, err := r.message(l, l.Key)
		if err == nil {
			futures[i], err = r.js.PublishMsgAsync(msg)
		}
		errs[i] = err
	}
	wait, stop := context.WithTimeout(fctx, r.cfg.PublishTimeout)
	defer stop()
	var handover []*handoff.Lease
	for i, l := range leases {
		if errs[i] != nil {
			r.publishFailed(fctx, l, errs[i])
			continue
		}
		var ack *jetstream.PubAck
		select {
		case ack = <-futures[i].Ok():
		case err := <-futures[i].Err():
			errs[i] = err
		case <-wait.Done():
			errs[i] = fmt.Errorf("no publish ack within %s", r.cfg.PublishTimeout)
		}
		if errs[i] == nil && ack.Duplicate {
			r.m.duplicates.WithLabelValues(queue).Inc()
			errs[i] = r.resolveDuplicate(wait, l, ack)
		}
		if errs[i] != nil {
			r.publishFailed(fctx, l, errs[i])
			continue
		}
		handover = append(handover, l)
	}
	if r.cfg.AfterPublish != nil {
		r.cfg.AfterPublish(len(handover))
	}
	done, err := handoff.HandOver(fctx, r.pool, handover, r.horizon)
	if err != nil {
		// The effects stay leased by the relay; when the lease expires the
		// sweeper makes them available and they are published again, as
		// duplicates.
		return len(leases), fmt.Errorf("hand over %d published effects: %w", len(handover), err)
	}
	r.m.published.WithLabelValues(queue).Add(float64(len(handover)))
	if taken := len(handover) - len(done); taken > 0 {
		r.log.Debug("effects taken over before their hand-over committed", "queue", queue, "count", taken)
	}
	return len(leases), nil
}

// message builds the relayed message of l with the given message id.
func (r *Relay) message(l *handoff.Lease, msgID string) (*natsgo.Msg, error) {
	if err := checkSubjectTail(l.Type); err != nil {
		return nil, pgoutbox.Permanent(err)
	}
	body, err := json.Marshal(Envelope{
		EffectID: l.ID, Queue: l.Queue, Type: l.Type, Key: l.Key, Payload: l.Payload,
		Attempts: l.Attempt, MaxAttempts: l.MaxAttempts, CreatedAt: l.CreatedAt, RelayToken: l.LeaseToken,
	})
	if err != nil {
		return nil, pgoutbox.Permanent(err)
	}
	msg := natsgo.NewMsg(r.cfg.Stream.Subject(l.Queue, l.Type))
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	msg.Header.Set(HeaderEffectID, strconv.FormatInt(l.ID, 10))
	msg.Header.Set(HeaderQueue, l.Queue)
	msg.Header.Set(HeaderType, l.Type)
	if tp := l.Traceparent(); tp != "" {
		msg.Header.Set(HeaderTraceparent, tp)
	}
	return msg, nil
}

// resolveDuplicate handles a duplicate ack. The stream already stored a
// message under this id within the duplicate window: if that message is
// still in the stream and carries this effect, it will be delivered and the
// effect is handed over. If it is gone (consumed: the effect was delivered,
// and has since been replayed from dead_letter) or carries another effect (a
// key shared by two queues), the effect is published again under the
// deterministic id "<key>~<sequence of the message it replaces>", so that a
// relay crash during this step still cannot store it twice.
func (r *Relay) resolveDuplicate(ctx context.Context, l *handoff.Lease, ack *jetstream.PubAck) error {
	for range 16 {
		stored, err := r.stream.GetMsg(ctx, ack.Sequence)
		switch {
		case err == nil && stored.Header.Get(HeaderEffectID) == strconv.FormatInt(l.ID, 10):
			return nil
		case err != nil && !errors.Is(err, jetstream.ErrMsgNotFound):
			return fmt.Errorf("look up the duplicate's message %d: %w", ack.Sequence, err)
		}
		msg, err := r.message(l, l.Key+"~"+strconv.FormatUint(ack.Sequence, 10))
		if err != nil {
			return err
		}
		if ack, err = r.js.PublishMsg(ctx, msg); err != nil {
			return err
		}
		if !ack.Duplicate {
			return nil
		}
	}
	return errors.New("too many replays of this effect within the duplicate window")
}

// publishFailed records a failed publish: a permanent error (a subject or
// payload the broker can never take) dead-letters the effect; anything else
// releases it to available after a short delay without counting a delivery
// attempt (the broker being unreachable is not the effect's fault).
func (r *Relay) publishFailed(ctx context.Context, l *handoff.Lease, err error) {
	r.m.failed.WithLabelValues(l.Queue).Inc()
	var oe *pgoutbox.OutcomeError
	if errors.Is(err, natsgo.ErrMaxPayload) || (errors.As(err, &oe) && oe.Outcome == pgoutbox.OutcomePermanent) {
		if ferr := l.DeadLetter(ctx, r.pool, pgoutbox.Permanent(fmt.Errorf("relay: %w", err))); ferr != nil {
			r.log.Error("recording a failed relay", "effect_id", l.ID, "err", ferr)
		}
		r.log.Error("effect cannot be relayed; dead-lettered", "effect_id", l.ID, "queue", l.Queue, "effect_type", l.Type, "err", err)
		return
	}
	if rerr := l.Release(ctx, r.pool, time.Second, "relay publish failed: "+err.Error()); rerr != nil {
		r.log.Error("releasing a failed relay", "effect_id", l.ID, "err", rerr)
	}
	r.log.Warn("relay publish failed; released", "effect_id", l.ID, "queue", l.Queue, "err", err)
}

// signal sends on ch without blocking: a wake-up already pending is enough.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
