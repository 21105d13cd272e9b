package cli

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/internal/server"
)

// natsFlags are work's broker settings (docs/scale-out.md).
type natsFlags struct {
	relay, from  string
	metricsAddr  string // not NATS: the work process's /metrics listener
	url          string
	stream       string
	prefix       string
	durable      string
	relayQueues  []string
	ackWait      time.Duration
	maxAttempts  int
	relayBatch   int
	consumerConc int
}

func (n *natsFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&n.relay, "relay", envOr("OUTBOX_RELAY", ""),
		`relay the --relay-queues to a broker instead of delivering them here: "nats" (env OUTBOX_RELAY)`)
	f.StringVar(&n.from, "from", envOr("OUTBOX_CONSUME_FROM", ""),
		`deliver the --relay-queues from a broker with this process's handlers: "nats" (env OUTBOX_CONSUME_FROM)`)
	f.StringVar(&n.url, "nats-url", envOr("NATS_URL", natsgo.DefaultURL), "NATS server URL (env NATS_URL)")
	f.StringSliceVar(&n.relayQueues, "relay-queues", splitList(envOr("OUTBOX_RELAY_QUEUES", "")),
		"queues relayed through the broker (env OUTBOX_RELAY_QUEUES, comma-separated; default every queue of the started applications)")
	f.StringVar(&n.stream, "nats-stream", envOr("NATS_STREAM", pgnats.StreamNameDefault),
		"JetStream stream of relayed effects, created when missing (env NATS_STREAM)")
	f.StringVar(&n.prefix, "nats-subject-prefix", envOr("NATS_SUBJECT_PREFIX", pgnats.SubjectPrefixDefault),
		"subjects are <prefix>.<queue>.<effect_type> (env NATS_SUBJECT_PREFIX)")
	f.StringVar(&n.durable, "nats-durable", envOr("NATS_DURABLE", pgnats.DurableDefault),
		"durable consumers are named <durable>-<queue> (env NATS_DURABLE)")
	f.DurationVar(&n.ackWait, "ack-wait", envDuration("NATS_ACK_WAIT", pgnats.AckWaitDefault),
		"JetStream ack wait; below --lease (env NATS_ACK_WAIT)")
	f.IntVar(&n.maxAttempts, "max-attempts", envInt("OUTBOX_MAX_ATTEMPTS", pgoutbox.MaxAttemptsDefault),
		"the largest max_attempts of relayed effects, for the retry horizon (env OUTBOX_MAX_ATTEMPTS)")
	f.IntVar(&n.relayBatch, "relay-batch", envInt("OUTBOX_RELAY_BATCH", pgnats.RelayBatchDefault),
		"effects per relay claim (env OUTBOX_RELAY_BATCH)")
	f.StringVar(&n.metricsAddr, "metrics-addr", envOr("PGOUTBOX_METRICS_ADDR", "127.0.0.1:9101"),
		"serve /metrics, /-/healthy and /-/ready here; empty: none (env PGOUTBOX_METRICS_ADDR; /metrics behind bearer PGOUTBOX_OPERATOR_TOKEN when set)")
	f.IntVar(&n.consumerConc, "consumer-concurrency", envInt("OUTBOX_CONSUMER_CONCURRENCY", 0),
		"deliveries in flight per consumed queue (env OUTBOX_CONSUMER_CONCURRENCY; default the queue's concurrency)")
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newWorkCmd(g *globals) *cobra.Command {
	var eng engineFlags
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "work",
		Short: "Run the workers only (no HTTP); optionally relay queues to NATS JetStream or deliver them from it",
		Long: `work runs the workers of every configured application, the sweeper and retention
pruning, without the HTTP server. With --relay nats the --relay-queues are not
delivered here but published to a JetStream stream (one message per effect,
Nats-Msg-Id = idempotency key) and handed over; with --from nats this process
delivers those queues from JetStream with the applications' handlers and
records every outcome in PostgreSQL. Both may run in one process or in many.
The stream is created when missing; work refuses to start when its duplicate
window is shorter than the retry horizon. See docs/scale-out.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for flag, v := range map[string]string{"--relay": nf.relay, "--from": nf.from} {
				if v != "" && v != "nats" {
					return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("%s %q: the supported broker is nats", flag, v)}
				}
			}
			return runWork(cmd.Context(), g, &eng, &nf)
		},
	}
	eng.register(cmd)
	nf.register(cmd)
	return cmd
}

// runWork is work's process: runProcess with, for --relay or --from, the
// NATS relay and consumer (startBroker) and, with --metrics-addr, a
// /metrics listener once the client runs. The in-process client works the
// other queues and runs the sweeper, which also recovers relay and consumer
// leases.
func runWork(ctx context.Context, g *globals, eng *engineFlags, nf *natsFlags) error {
	var metrics *server.Server
	return runProcess(ctx, g, eng, processHooks{
		configure: func(ctx context.Context, e *engine, next func() error) error {
			if nf.relay == "" && nf.from == "" {
				return next()
			}
			return startBroker(ctx, g, eng, nf, e, next)
		},
		started: func(_ context.Context, e *engine) (<-chan error, error) {
			if nf.metricsAddr != "" {
				// /metrics and the probes; no application routes. /metrics is an
				// operator route: behind PGOUTBOX_OPERATOR_TOKEN when set.
				srv := server.NewWithOptions(e.log, e.reg, operatorOptions(""))
				ln, err := net.Listen("tcp", nf.metricsAddr)
				if err != nil {
					return nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--metrics-addr %s: %w", nf.metricsAddr, err)}
				}
				go func() { _ = srv.Serve(ln) }()
				srv.SetReady(true)
				metrics = srv
				fmt.Fprintf(g.stdout, "pgoutbox metrics on http://%s/metrics\n", ln.Addr())
			}
			fmt.Fprintf(g.stdout, "pgoutbox working %d in-process queues (Ctrl-C to stop)\n", len(e.cfg.Queues))
			return nil, nil
		},
		shutdown: func(ctx context.Context) {
			if metrics != nil {
				_ = metrics.Shutdown(ctx)
			}
		},
	})
}

// startBroker connects to NATS and starts the relay (--relay) and the
// consumer (--from) of the relayed queues, which it takes out of e.cfg so
// that the in-process client does not claim them; then runs next, and
// stops them when it returns.
func startBroker(ctx context.Context, g *globals, eng *engineFlags, nf *natsFlags, e *engine, next func() error) error {
	log, pool, reg, cfg := e.log, e.pool, e.reg, &e.cfg
	var relay *pgnats.Relay
	var consumer *pgnats.Consumer
	nc, err := natsgo.Connect(nf.url, natsgo.Name("pgoutbox work"), natsgo.MaxReconnects(-1))
	if err != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("connect to NATS at %s: %w", nf.url, err)}
	}
	defer nc.Close()
	queues := nf.relayQueues
	if len(queues) == 0 {
		queues = slices.Sorted(maps.Keys(cfg.Queues))
	}
	// Every relay loop publishes a whole batch before it waits for the
	// acks: let them all be in flight.
	inflight := max(4000, 2*nf.relayBatch*pgnats.RelayConcurrencyDefault*len(queues))
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inflight))
	if err != nil {
		return &ExitError{Code: ExitCouldNotRun, Err: err}
	}
	if !slices.ContainsFunc(cfg.Types, func(t pgoutbox.EffectType) bool { return t.Name == pgnats.PublishTypeName }) {
		cfg.Types = append(cfg.Types, pgnats.PublishType(js))
	}
	if len(queues) == 0 {
		return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("no queues to relay: set --relay-queues (no application with queues is configured)")}
	}
	// Relayed queues are not claimed in-process: the relay claims them,
	// and consumers deliver them.
	consumed := map[string]pgoutbox.QueueConfig{}
	for _, q := range queues {
		qc := cfg.Queues[q]
		if nf.consumerConc > 0 {
			qc.Concurrency = nf.consumerConc
		}
		qc.ClaimBatch = 0
		if qc.DeliveryTimeout >= eng.lease {
			qc.DeliveryTimeout = 0
		}
		consumed[q] = qc
		delete(cfg.Queues, q)
	}
	policy := pgnats.RetryPolicy{MaxAttempts: nf.maxAttempts, BackoffCap: eng.backoffCap, LeaseDuration: eng.lease}
	stream := pgnats.Stream{Name: nf.stream, SubjectPrefix: nf.prefix}
	if nf.relay != "" {
		relay, err = pgnats.NewRelay(pool, js, pgnats.RelayConfig{
			Queues: queues, Types: cfg.Types, Stream: stream, Retry: policy, Batch: nf.relayBatch,
			PollInterval: eng.poll, Logger: log, Registerer: reg,
		})
		if err == nil {
			err = relay.Start(ctx)
		}
		if err != nil {
			return &ExitError{Code: ExitCouldNotRun, Err: err}
		}
		defer stopWithin(eng.stopTimeout, relay.Stop)
		fmt.Fprintf(g.stdout, "pgoutbox relaying %s to NATS stream %s at %s\n", strings.Join(queues, ", "), nf.stream, nf.url)
	}
	if nf.from != "" {
		consumer, err = pgnats.NewConsumer(pool, js, pgnats.ConsumerConfig{
			Queues: consumed, Types: cfg.Types, Stream: stream, Retry: policy, Durable: nf.durable,
			AckWait: nf.ackWait, Logger: log, Registerer: reg,
		})
		if err == nil {
			err = consumer.Start(ctx)
		}
		if err != nil {
			return &ExitError{Code: ExitCouldNotRun, Err: err}
		}
		defer stopWithin(eng.stopTimeout, consumer.Stop)
		fmt.Fprintf(g.stdout, "pgoutbox delivering %s from NATS stream %s at %s\n", strings.Join(queues, ", "), nf.stream, nf.url)
	}
	return next()
}

// stopWithin calls stop with a context bounded by d, logging nothing: each
// component logs its own shutdown.
func stopWithin(d time.Duration, stop func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_ = stop(ctx)
}
