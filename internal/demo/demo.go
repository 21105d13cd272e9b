package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/console"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/server"
	"github.com/pgoutbox/pgoutbox/internal/store"
)

// Defaults of Options.
const (
	// AddrDefault lets the system pick a free port.
	AddrDefault = "127.0.0.1:0"
	// RecordsDefault is the size of the generated import.
	RecordsDefault = 3000
	// StoryTimeoutDefault bounds the story; effects still moving after it
	// are reported as lost.
	StoryTimeoutDefault = 3 * time.Minute
	// BackoffCapDefault keeps the demo's retries short (production: 300 s).
	BackoffCapDefault = 2 * time.Second
)

// Options configure a demo.
type Options struct {
	// Pool is a migrated database.
	Pool *pgxpool.Pool
	// Addr is the HTTP listen address; default AddrDefault.
	Addr string
	// Out receives the story, the live status and the summary.
	Out io.Writer
	// Log receives the components' logs; default discards them.
	Log *slog.Logger
	// Live redraws a one-line status (a terminal); otherwise status lines
	// are printed every few seconds.
	Live bool
	// Records is the number of records imported; default RecordsDefault.
	Records int
	// SPARQLURL, when set, also projects records to that SPARQL 1.1 update
	// endpoint.
	SPARQLURL string
	// StoryTimeout default StoryTimeoutDefault.
	StoryTimeout time.Duration
	// OperatorToken signs operators in to the console (/console/), where
	// the demo's incidents can be handled; empty: the console is read-only.
	OperatorToken string
	// Command is how the summary's hints invoke the binary, as the user
	// started it (e.g. ./bin/pgoutbox); default "pgoutbox".
	Command string
	// ExitWhenDone says the demo stops after its summary: the hints then
	// leave out what needs it running (/workers, the GitHub emulator).
	ExitWhenDone bool
	// KeyDir is where the summary writes the GitHub emulator's throwaway
	// App key for its export hint (GitHubEnv); empty: os.TempDir().
	KeyDir string
}

// Demo is a running demo system.
type Demo struct {
	o       Options
	run     string // this run's id: tags, commits and records carry it
	since   time.Time
	base    string
	srv     *server.Server
	ln      net.Listener
	client  *pgoutbox.Client
	gh      *fakegh.Server
	cp      *controlplane.App
	proj    *projectionStory
	stopped chan struct{}

	events    <-chan pgoutbox.Event
	unsub     func()
	counts    outcomeCounts
	bg        sync.WaitGroup
	bgCancel  context.CancelFunc
	serveErr  chan error
	storyLine func(format string, args ...any)
}

// outcomeCounts tallies this run's delivery outcomes from the client's events.
type outcomeCounts struct {
	deliveries, retries, deadLetters, reconciliation atomic.Int64
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Start builds and starts everything: emulators, applications, engine and
// HTTP server. Stop it with Close.
func Start(ctx context.Context, o Options) (*Demo, error) {
	if o.Pool == nil {
		return nil, errors.New("demo: no database")
	}
	if o.Addr == "" {
		o.Addr = AddrDefault
	}
	if o.Records <= 0 {
		o.Records = RecordsDefault
	}
	if o.StoryTimeout <= 0 {
		o.StoryTimeout = StoryTimeoutDefault
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	d := &Demo{o: o, run: randomHex(4), stopped: make(chan struct{}), serveErr: make(chan error, 1)}
	d.storyLine = func(format string, args ...any) { d.say(format, args...) }
	if err := o.Pool.QueryRow(ctx, `SELECT now()`).Scan(&d.since); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("demo: listen on %s: %w", o.Addr, err)
	}
	d.ln = ln
	d.base = "http://" + ln.Addr().String()

	// /metrics carries the database gauges (pgoutbox_effects by state,
	// oldest available age, stalled leases, xmin age) like serve's, read
	// through a stats cache, besides the engine's own metrics.
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(ops.NewStatsCache(o.Pool, ops.StatusOptions{}, 0), o.Log))
	d.srv = server.New(o.Log, reg)

	// The GitHub emulator delivers its webhooks to our real endpoint.
	secret := []byte(randomHex(16))
	d.gh = fakegh.New(fakegh.Options{WebhookURL: d.base + "/webhooks/github", WebhookSecret: secret})
	httpClient := &http.Client{Timeout: 10 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, d.gh.URL(), d.gh.AppID(), d.gh.AppPrivateKey(), nil)
	if err != nil {
		d.closeEmulators()
		return nil, err
	}
	d.cp, err = controlplane.New(o.Pool, controlplane.Config{WebhookSecret: secret},
		github.NewClient(httpClient, d.gh.URL(), tokens), o.Log)
	if err != nil {
		d.closeEmulators()
		return nil, err
	}
	d.cp.Routes(d.srv)
	con, err := console.New(console.Config{Pool: o.Pool, OperatorToken: o.OperatorToken, ControlPlane: d.cp, GitHub: true, Logger: o.Log,
		Limiter: d.srv.OperatorLimiter()})
	if err != nil {
		d.closeEmulators()
		return nil, err
	}
	d.srv.HandleOperatorSelfAuth(console.Prefix, con.Handler())
	cfg := pgoutbox.Config{
		Logger: o.Log, Registerer: reg, BackoffCap: BackoffCapDefault,
		PollInterval: 250 * time.Millisecond, Queues: map[string]pgoutbox.QueueConfig{},
	}
	for q, qc := range d.cp.Queues() {
		cfg.Queues[q] = qc
	}
	cfg.Types = append(cfg.Types, d.cp.Types()...)
	if d.proj, err = newProjectionStory(d, &cfg); err != nil {
		d.closeEmulators()
		return nil, err
	}
	// The workers page says what this process serves: its Client works
	// every queue of cfg, the projection's included (issue 30).
	d.srv.HandleOperatorSelfAuth("GET "+console.WorkersPath, con.Workers(console.WorkersConfig{
		Served: slices.Sorted(maps.Keys(cfg.Queues)), Projection: d.proj.app}))
	if d.client, err = pgoutbox.NewClient(o.Pool, cfg); err != nil {
		d.closeEmulators()
		return nil, err
	}
	d.events, d.unsub = d.client.Subscribe(1 << 16)
	if err := d.client.Start(ctx); err != nil {
		d.closeEmulators()
		return nil, err
	}
	go func() { d.serveErr <- d.srv.Serve(ln) }()
	d.srv.SetReady(true)
	bgCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.bgCancel = cancel
	d.bg.Go(func() { d.tally(bgCtx) })
	return d, nil
}

// URL is the server's base URL.
func (d *Demo) URL() string { return d.base }

func (d *Demo) say(format string, args ...any) {
	d.clearLive()
	fmt.Fprintf(d.o.Out, "  "+format+"\n", args...)
}

// tally counts this run's outcomes.
func (d *Demo) tally(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-d.events:
			switch {
			case e.Outcome == pgoutbox.OutcomeSuccess && e.State == pgoutbox.StateCompleted:
				d.counts.deliveries.Add(1)
			case e.State == pgoutbox.StateAvailable:
				d.counts.retries.Add(1)
			case e.State == pgoutbox.StateDeadLetter:
				d.counts.deadLetters.Add(1)
			case e.State == pgoutbox.StateReconciliationRequired || e.Outcome == pgoutbox.OutcomeAmbiguous:
				d.counts.reconciliation.Add(1)
			}
		}
	}
}

func (d *Demo) closeEmulators() {
	if d.gh != nil {
		d.gh.Close()
	}
	if d.proj != nil {
		d.proj.close()
	}
	if d.ln != nil {
		_ = d.ln.Close()
	}
}

// Close stops the server, the engine (gracefully, within ctx) and the
// emulators.
func (d *Demo) Close(ctx context.Context) error {
	_ = d.srv.Shutdown(ctx)
	err := d.client.Stop(ctx)
	d.unsub()
	d.bgCancel()
	d.bg.Wait()
	d.closeEmulators()
	return err
}

// Serve blocks until ctx ends or the server fails.
func (d *Demo) Serve(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-d.serveErr:
		return err
	}
}

// waitFor polls cond every 50 ms until it holds or ctx ends.
func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s", what)
		case <-t.C:
		}
	}
}

func (d *Demo) scalar(ctx context.Context, sql string, args ...any) (int64, error) {
	var n int64
	err := d.o.Pool.QueryRow(ctx, sql, args...).Scan(&n)
	return n, err
}

// countRun counts this run's effects (created since the run began) in any
// of states, of queue ("" for every queue), through the engine's statement.
func (d *Demo) countRun(ctx context.Context, queue string, states ...string) (int64, error) {
	counts, err := store.CountCreatedSince(ctx, d.o.Pool, d.since)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range counts {
		if (queue == "" || c.Queue == queue) && slices.Contains(states, c.State) {
			n += c.Count
		}
	}
	return n, nil
}

// GitHubEnv writes the emulator's (throwaway) App key into dir and returns
// the environment that points `pgoutbox reconcile inspect` at the running
// emulator.
func (d *Demo) GitHubEnv(dir string) ([]string, error) {
	path := filepath.Join(dir, "demo-github-app.pem")
	if err := os.WriteFile(path, d.gh.AppPrivateKeyPEM(), 0o600); err != nil {
		return nil, err
	}
	return []string{
		"GITHUB_API_URL=" + d.gh.URL(),
		"GITHUB_APP_ID=" + d.gh.AppID(),
		"GITHUB_APP_PRIVATE_KEY_FILE=" + path,
	}, nil
}
