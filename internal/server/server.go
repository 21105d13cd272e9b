// Package server is pgoutbox's HTTP surface: health and readiness probes,
// /metrics, and the routes the applications mount.
//
// /-/healthy answers 200 while the process lives. /-/ready answers 503 until
// SetReady(true) and again from the moment shutdown begins, so a load
// balancer drains the instance before it stops.
//
// # Operator routes
//
// /metrics and the routes mounted with HandleOperator show queue names,
// record ids and error text: they
// are for operators, not for the public that reaches the webhook. Options
// keep them apart: OperatorToken requires "Authorization: Bearer <token>"
// on them, and SeparateOperator serves them only from OperatorHandler (a
// listener of their own, e.g. on a private interface), never from Handler.
// HandleOperatorSelfAuth places a route the same way without the bearer
// check, for the operator console and its /workers page, which sign
// browsers in themselves (and check the bearer token of scripts).
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// ReadHeaderTimeoutDefault bounds how long a client may take to send headers.
const ReadHeaderTimeoutDefault = 10 * time.Second

// ShutdownTimeoutDefault bounds graceful HTTP shutdown.
const ShutdownTimeoutDefault = 15 * time.Second

// Options say where and how the operator routes are served. The zero value
// serves them on Handler without authentication (a listener that only
// operators reach, e.g. 127.0.0.1).
type Options struct {
	// OperatorToken, when not empty, is the bearer token every operator
	// route requires (PGOUTBOX_OPERATOR_TOKEN): a request without it, or
	// with another, is answered 401 with WWW-Authenticate: Bearer. Tokens
	// are compared in constant time over SHA-256 digests and never logged,
	// and only under Limiter: once a client address has spent its budget
	// of wrong tokens, its bearer requests answer 429 with Retry-After,
	// uncompared.
	OperatorToken string
	// Limiter counts the operator-token comparisons; nil means one of its
	// own with httpx's defaults (5 wrong tokens per address per 5
	// minutes). `serve` passes the console's (internal/console), so that
	// every route accepting the token shares one budget per address.
	Limiter *httpx.GuessLimiter
	// SeparateOperator serves the operator routes only from
	// OperatorHandler (PGOUTBOX_OPERATOR_ADDR): Handler answers 404 for
	// them. Default false: Handler serves them too.
	SeparateOperator bool
}

// Server is the HTTP server.
type Server struct {
	mux   *http.ServeMux // public: probes, application routes, and operator routes unless separate
	opMux *http.ServeMux // operator listener: probes and operator routes
	opts  Options
	log   *slog.Logger
	ready atomic.Bool

	mu     sync.Mutex
	srvs   []*http.Server
	closed bool // Shutdown ran: a later Serve returns at once
}

// New returns a server with the probe routes and /metrics served from
// gatherer (nil: no /metrics route), operator routes open on Handler.
func New(log *slog.Logger, gatherer prometheus.Gatherer) *Server {
	return NewWithOptions(log, gatherer, Options{})
}

// NewWithOptions is New with the operator routes placed and guarded by
// opts.
func NewWithOptions(log *slog.Logger, gatherer prometheus.Gatherer, opts Options) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Limiter == nil {
		opts.Limiter = httpx.NewGuessLimiter(0, 0, nil)
	}
	s := &Server{mux: http.NewServeMux(), opMux: http.NewServeMux(), opts: opts, log: log}
	healthy := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	}
	ready := func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	}
	for _, m := range []*http.ServeMux{s.mux, s.opMux} {
		m.HandleFunc("GET /-/healthy", healthy)
		m.HandleFunc("GET /-/ready", ready)
	}
	if gatherer != nil {
		s.HandleOperator("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	return s
}

// OperatorLimiter returns the limiter of the operator-token comparisons
// (Options.Limiter, or the server's own), for a self-authenticating route
// (HandleOperatorSelfAuth) to share.
func (s *Server) OperatorLimiter() *httpx.GuessLimiter { return s.opts.Limiter }

// Handle mounts an application route (Go 1.22 pattern syntax).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandleOperator mounts an operator route: behind OperatorToken when set,
// on OperatorHandler always, and on Handler unless SeparateOperator.
func (s *Server) HandleOperator(pattern string, h http.Handler) {
	if s.opts.OperatorToken != "" {
		h = requireOperatorToken(s.opts.OperatorToken, s.opts.Limiter, h)
	}
	s.opMux.Handle(pattern, h)
	if !s.opts.SeparateOperator {
		s.mux.Handle(pattern, h)
	}
}

// HandleOperatorSelfAuth mounts an operator route that authenticates its
// requests itself: placed like HandleOperator (on OperatorHandler always,
// on Handler unless SeparateOperator) but never wrapped by the bearer
// check. It is for the operator console (internal/console), which a
// browser reaches: a browser cannot send a bearer header, so the console
// exchanges OperatorToken for a session cookie at its own sign-in and must
// enforce it on every other route.
func (s *Server) HandleOperatorSelfAuth(pattern string, h http.Handler) {
	s.opMux.Handle(pattern, h)
	if !s.opts.SeparateOperator {
		s.mux.Handle(pattern, h)
	}
}

// requireOperatorToken answers 401 to a request without the bearer token
// or with another, and 429 (uncompared) once the client's budget in lim is
// spent.
func requireOperatorToken(token string, lim *httpx.GuessLimiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok, wait := httpx.CheckBearer(lim, r, token) // missing or wrong: the same 401
		switch {
		case ok:
			next.ServeHTTP(w, r)
		case wait > 0:
			httpx.RetryAfter(w, wait)
			httpx.Error(w, http.StatusTooManyRequests, "too many wrong operator tokens from your address; retry later")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox operator"`)
			httpx.Error(w, http.StatusUnauthorized, "missing or invalid bearer token (PGOUTBOX_OPERATOR_TOKEN)")
		}
	})
}

// Handler returns the root handler of the main listener.
func (s *Server) Handler() http.Handler { return s.mux }

// OperatorHandler returns the root handler of the operator listener: the
// probes and the operator routes.
func (s *Server) OperatorHandler() http.Handler { return s.opMux }

// SetReady flips /-/ready.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Serve accepts on ln with Handler until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln, s.mux) }

// ServeOperator accepts on ln with OperatorHandler until Shutdown.
func (s *Server) ServeOperator(ln net.Listener) error { return s.serve(ln, s.opMux) }

func (s *Server) serve(ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeoutDefault}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ln.Close()
	}
	s.srvs = append(s.srvs, srv)
	s.mu.Unlock()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown marks the server not ready and drains the connections of every
// listener.
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetReady(false)
	s.mu.Lock()
	s.closed = true
	srvs := s.srvs
	s.mu.Unlock()
	var errs []error
	for _, srv := range srvs {
		errs = append(errs, srv.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
