// Package server is pgoutbox's HTTP surface: health and readiness probes,
// /metrics, and the routes the applications mount.
//
// /-/healthy answers 200 while the process lives. /-/ready answers 503 until
// SetReady(true) and again from the moment shutdown begins, so a load
// balancer drains the instance before it stops.
package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadHeaderTimeoutDefault bounds how long a client may take to send headers.
const ReadHeaderTimeoutDefault = 10 * time.Second

// ShutdownTimeoutDefault bounds graceful HTTP shutdown.
const ShutdownTimeoutDefault = 15 * time.Second

// Server is the HTTP server.
type Server struct {
	mux   *http.ServeMux
	log   *slog.Logger
	ready atomic.Bool
	srv   *http.Server
}

// New returns a server with the probe routes and /metrics served from
// gatherer (nil: no /metrics route).
func New(log *slog.Logger, gatherer prometheus.Gatherer) *Server {
	s := &Server{mux: http.NewServeMux(), log: log}
	s.mux.HandleFunc("GET /-/healthy", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	s.mux.HandleFunc("GET /-/ready", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	if gatherer != nil {
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	}
	return s
}

// Handle mounts an application route (Go 1.22 pattern syntax).
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Handler returns the root handler (for tests).
func (s *Server) Handler() http.Handler { return s.mux }

// SetReady flips /-/ready.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Serve accepts on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: ReadHeaderTimeoutDefault}
	err := s.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown marks the server not ready and drains connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.SetReady(false)
	if s.srv == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}
