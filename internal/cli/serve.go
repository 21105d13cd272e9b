package cli

import (
	"context"
	"fmt"
	"net"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/server"
)

// engineFlags are the engine settings shared by serve and work.
type engineFlags struct {
	lease       time.Duration
	poll        time.Duration
	retention   time.Duration
	stopTimeout time.Duration
	sweepEvery  time.Duration
	backoffCap  time.Duration
}

func (e *engineFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&e.lease, "lease", envDuration("OUTBOX_LEASE_DURATION", pgoutbox.LeaseDurationDefault),
		"lease duration of a claim (env OUTBOX_LEASE_DURATION)")
	f.DurationVar(&e.poll, "poll-interval", envDuration("OUTBOX_POLL_INTERVAL", pgoutbox.PollIntervalDefault),
		"polling fallback when no NOTIFY arrives (env OUTBOX_POLL_INTERVAL)")
	f.DurationVar(&e.retention, "completed-retention", envDuration("OUTBOX_COMPLETED_RETENTION", pgoutbox.CompletedRetentionDefault),
		"how long completed effects are kept (env OUTBOX_COMPLETED_RETENTION)")
	f.DurationVar(&e.sweepEvery, "sweep-interval", envDuration("OUTBOX_SWEEP_INTERVAL", pgoutbox.SweepIntervalDefault),
		"how often expired leases are recovered (env OUTBOX_SWEEP_INTERVAL)")
	f.DurationVar(&e.stopTimeout, "shutdown-timeout", envDuration("OUTBOX_SHUTDOWN_TIMEOUT", 30*time.Second),
		"how long in-flight deliveries may finish at shutdown (env OUTBOX_SHUTDOWN_TIMEOUT)")
	f.DurationVar(&e.backoffCap, "backoff-cap", envDuration("OUTBOX_BACKOFF_CAP", pgoutbox.BackoffCapDefault),
		"retry backoff cap (env OUTBOX_BACKOFF_CAP)")
}

func (e *engineFlags) config(g *globals, reg prometheus.Registerer) pgoutbox.Config {
	return pgoutbox.Config{
		Logger:             g.logger(),
		Registerer:         reg,
		LeaseDuration:      e.lease,
		PollInterval:       e.poll,
		CompletedRetention: e.retention,
		SweepInterval:      e.sweepEvery,
		BackoffCap:         e.backoffCap,
		SessionURL:         g.sessionURL,
	}
}

func newServeCmd(g *globals) *cobra.Command {
	var addr string
	var eng engineFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP server and the workers (graceful shutdown on SIGINT/SIGTERM)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			e, err := g.openEngine(ctx, &eng, nil)
			if err != nil {
				return err
			}
			defer e.pool.Close()
			log, pool, reg, cfg, apps := e.log, e.pool, e.reg, e.cfg, e.apps
			client, err := pgoutbox.NewClient(pool, cfg)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			defer startOps(ctx, g, pool, reg, client.ID())() // gauges on reg; aggregate samples (internal/ops)
			srv := server.New(log, reg)
			for _, app := range apps {
				if app.routes != nil {
					app.routes(srv)
				}
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: fmt.Errorf("listen on %s: %w", addr, err)}
			}
			if err := client.Start(ctx); err != nil {
				_ = ln.Close()
				return &ExitError{Code: ExitCouldNotRun, Err: err}
			}
			stopComponents := runComponents(ctx, apps, log)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			srv.SetReady(true)
			log.Info("serving", "addr", "http://"+ln.Addr().String())
			fmt.Fprintf(g.stdout, "pgoutbox serving on http://%s (Ctrl-C to stop)\n", ln.Addr())

			var serveErr error
			select {
			case <-ctx.Done():
			case serveErr = <-errc:
			}
			log.Info("shutting down")
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), eng.stopTimeout)
			defer cancel()
			_ = srv.Shutdown(sctx)
			if err := client.Stop(sctx); err != nil {
				log.Warn("worker shutdown", "err", err)
			}
			stopComponents()
			if serveErr != nil {
				return &ExitError{Code: ExitCouldNotRun, Err: serveErr}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&addr, "addr", envOr("PGOUTBOX_ADDR", "127.0.0.1:8080"),
		"HTTP listen address (env PGOUTBOX_ADDR)")
	eng.register(cmd)
	return cmd
}
