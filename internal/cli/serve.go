package cli

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/server"
)

// engineFlags are the engine settings shared by serve and work.
type engineFlags struct {
	lease       time.Duration
	poll        time.Duration
	retention   time.Duration
	keyRetain   time.Duration
	stopTimeout time.Duration
	sweepEvery  time.Duration
	backoffCap  time.Duration
	rowLock     time.Duration
}

// rowLockLease maps the CLI's row-lock lease (0: off) to
// QueueConfig.RowLockLease (negative: off).
func rowLockLease(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

func (e *engineFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&e.lease, "lease", envDuration("OUTBOX_LEASE_DURATION", pgoutbox.LeaseDurationDefault),
		"lease duration of a claim (env OUTBOX_LEASE_DURATION)")
	f.DurationVar(&e.poll, "poll-interval", envDuration("OUTBOX_POLL_INTERVAL", pgoutbox.PollIntervalDefault),
		"polling fallback when no NOTIFY arrives (env OUTBOX_POLL_INTERVAL)")
	f.DurationVar(&e.retention, "completed-retention", envDuration("OUTBOX_COMPLETED_RETENTION", pgoutbox.CompletedRetentionDefault),
		"how long completed effects are kept (env OUTBOX_COMPLETED_RETENTION)")
	f.DurationVar(&e.keyRetain, "key-retention", envDuration("OUTBOX_KEY_RETENTION", 0),
		"how long an idempotency key is remembered after its first enqueue, even once its effect is pruned; 0 means 7 days, or --completed-retention when longer (env OUTBOX_KEY_RETENTION)")
	f.DurationVar(&e.sweepEvery, "sweep-interval", envDuration("OUTBOX_SWEEP_INTERVAL", pgoutbox.SweepIntervalDefault),
		"how often expired leases are recovered (env OUTBOX_SWEEP_INTERVAL)")
	f.DurationVar(&e.stopTimeout, "shutdown-timeout", envDuration("OUTBOX_SHUTDOWN_TIMEOUT", 30*time.Second),
		"how long in-flight deliveries may finish at shutdown (env OUTBOX_SHUTDOWN_TIMEOUT)")
	f.DurationVar(&e.backoffCap, "backoff-cap", envDuration("OUTBOX_BACKOFF_CAP", pgoutbox.BackoffCapDefault),
		"retry backoff cap (env OUTBOX_BACKOFF_CAP)")
	f.DurationVar(&e.rowLock, "row-lock-lease", envDuration("OUTBOX_ROW_LOCK_LEASE", pgoutbox.RowLockLeaseDefault),
		"lease replay-safe effects by the claim transaction's row lock for up to this long, then durably; 0: durable leases only (env OUTBOX_ROW_LOCK_LEASE)")
}

// queueDefaults applies the engine flags that are per queue to every queue
// of cfg that does not set its own.
func (e *engineFlags) queueDefaults(cfg *pgoutbox.Config) {
	if e.rowLock == pgoutbox.RowLockLeaseDefault {
		return // the engine's default, which also respects a short DeliveryTimeout
	}
	for name, q := range cfg.Queues {
		if q.RowLockLease == 0 {
			q.RowLockLease = rowLockLease(e.rowLock)
			cfg.Queues[name] = q
		}
	}
}

// validate refuses engine flags no configuration accepts, before anything
// is opened.
func (e *engineFlags) validate() error {
	if e.rowLock < 0 {
		return fmt.Errorf("--row-lock-lease (OUTBOX_ROW_LOCK_LEASE) must not be negative, got %s; 0 turns row-lock leases off", e.rowLock)
	}
	return nil
}

func (e *engineFlags) config(g *globals, reg prometheus.Registerer) pgoutbox.Config {
	return pgoutbox.Config{
		Logger:             g.logger(),
		Registerer:         reg,
		LeaseDuration:      e.lease,
		PollInterval:       e.poll,
		CompletedRetention: e.retention,
		KeyRetention:       e.keyRetain,
		SweepInterval:      e.sweepEvery,
		BackoffCap:         e.backoffCap,
		SessionURL:         g.sessionURL,
		SampleInterval:     envDuration("OUTBOX_SAMPLE_INTERVAL", pgoutbox.SampleIntervalDefault),
	}
}

func newServeCmd(g *globals) *cobra.Command {
	var addr, operatorAddr string
	var eng engineFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP server and the workers (graceful shutdown on SIGINT/SIGTERM)",
		Long: `serve runs the applications' HTTP routes and workers, the probes (/-/healthy,
/-/ready) and the operator routes (/metrics, the workers page /workers and
the operator console under /console/, docs/console.md).

The operator routes show queue names, record ids and error text. By default
they are served on --addr without authentication. When --addr is reachable
from outside (a public webhook), set --operator-addr (PGOUTBOX_OPERATOR_ADDR)
to a private address: they are then served only there, with the probes, and
--addr answers 404 for them. PGOUTBOX_OPERATOR_TOKEN, when set, makes them
require "Authorization: Bearer <token>" wherever they are served (401
otherwise); the token is never printed or logged. The console signs operators
in with that token instead (a session cookie, which /workers accepts too);
without it the console is read-only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), g, &eng, addr, operatorAddr)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", envOr("PGOUTBOX_ADDR", "127.0.0.1:8080"),
		"HTTP listen address (env PGOUTBOX_ADDR)")
	cmd.Flags().StringVar(&operatorAddr, "operator-addr", os.Getenv("PGOUTBOX_OPERATOR_ADDR"),
		"serve /metrics and /workers only on this address, not on --addr (env PGOUTBOX_OPERATOR_ADDR; bearer PGOUTBOX_OPERATOR_TOKEN when set)")
	eng.register(cmd)
	return cmd
}

// runServe is serve's process: runProcess with the HTTP server. Its
// listeners open before the client starts; it serves once the client and
// the components run, and drains its requests first at the graceful stop.
func runServe(ctx context.Context, g *globals, eng *engineFlags, addr, operatorAddr string) error {
	var srv *server.Server
	var ln, opLn net.Listener
	return runProcess(ctx, g, eng, processHooks{
		bind: func(e *engine) (func(), error) {
			srv = server.NewWithOptions(e.log, e.reg, operatorOptions(operatorAddr))
			for _, app := range e.apps {
				if app.routes != nil {
					app.routes(srv)
				}
			}
			if err := mountConsole(srv, e); err != nil {
				return nil, &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			var err error
			if ln, err = net.Listen("tcp", addr); err != nil {
				return nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("listen on %s: %w", addr, err)}
			}
			if operatorAddr != "" {
				if opLn, err = net.Listen("tcp", operatorAddr); err != nil {
					_ = ln.Close()
					return nil, &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("--operator-addr %s: %w", operatorAddr, err)}
				}
			}
			return func() {
				_ = ln.Close()
				if opLn != nil {
					_ = opLn.Close()
				}
			}, nil
		},
		started: func(_ context.Context, e *engine) (<-chan error, error) {
			errc := make(chan error, 2)
			go func() { errc <- srv.Serve(ln) }()
			if opLn != nil {
				go func() { errc <- srv.ServeOperator(opLn) }()
			}
			srv.SetReady(true)
			e.log.Info("serving", "addr", "http://"+ln.Addr().String())
			fmt.Fprintf(g.stdout, "pgoutbox serving on http://%s (Ctrl-C to stop)\n", ln.Addr())
			reportOperatorRoutes(g, e.log, opLn)
			return errc, nil
		},
		shutdown: func(ctx context.Context) { _ = srv.Shutdown(ctx) },
	})
}

// operatorOptions places the operator routes (/metrics, /workers): only on
// operatorAddr's listener when it is set, behind PGOUTBOX_OPERATOR_TOKEN
// when that is set (its value is never printed or logged).
func operatorOptions(operatorAddr string) server.Options {
	return server.Options{OperatorToken: os.Getenv("PGOUTBOX_OPERATOR_TOKEN"), SeparateOperator: operatorAddr != ""}
}

// mountConsole serves the operator console (internal/console) under
// /console/ and its workers page at /workers, placed like the operator
// routes. PGOUTBOX_OPERATOR_TOKEN is its sign-in token (unset: read-only).
// Reconciliation records are resolved through the control plane, checked
// against GitHub when the GitHub App settings are present.
func mountConsole(srv *server.Server, e *engine) error {
	pool, log := e.pool, e.log
	// A bad control-plane or GitHub setting costs the console its
	// reconciliation actions (the page says so), never the server.
	var gh controlplane.GitHub
	client, missing, err := githubClient()
	switch {
	case err != nil:
		log.Warn("console: GitHub App settings unusable; resolving reconciliation records needs force", "err", err)
	case missing == "":
		gh = client
	}
	cp, err := controlplane.ForOperations(pool, controlPlaneConfig(), gh, log)
	if err != nil {
		log.Warn("console: control plane settings unusable; reconciliation actions unavailable", "err", err)
		cp, gh = nil, nil
	}
	c, err := console.New(console.Config{Pool: pool, OperatorToken: os.Getenv("PGOUTBOX_OPERATOR_TOKEN"),
		ControlPlane: cp, GitHub: gh != nil, Logger: log, Limiter: srv.OperatorLimiter()})
	if err != nil {
		return err
	}
	srv.HandleOperatorSelfAuth(console.Prefix, c.Handler())
	wc := console.WorkersConfig{Served: slices.Sorted(maps.Keys(e.cfg.Queues))}
	for _, app := range e.apps {
		if app.projection != nil {
			wc.Projection = app.projection
		}
	}
	srv.HandleOperatorSelfAuth("GET "+console.WorkersPath, c.Workers(wc))
	return nil
}

// reportOperatorRoutes says where /metrics and /workers are served and how
// they are guarded (never the token), and warns when they are open on the
// main listener.
func reportOperatorRoutes(g *globals, log *slog.Logger, opLn net.Listener) {
	guard := "without a token"
	if os.Getenv("PGOUTBOX_OPERATOR_TOKEN") != "" {
		guard = "behind PGOUTBOX_OPERATOR_TOKEN"
	}
	if opLn != nil {
		log.Info("operator routes", "addr", "http://"+opLn.Addr().String(), "token", guard != "without a token")
		fmt.Fprintf(g.stdout, "pgoutbox operator routes (/metrics, /workers, /console/) on http://%s only, %s\n", opLn.Addr(), guard)
		return
	}
	if guard == "without a token" {
		log.Warn("operator routes /metrics and /workers are open on the main listener; if it is reachable from outside " +
			"(a public webhook), set PGOUTBOX_OPERATOR_ADDR to a private address or PGOUTBOX_OPERATOR_TOKEN")
	}
}
