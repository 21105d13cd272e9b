// Package loopback serves an http.Handler on a free port of 127.0.0.1, for
// the emulators (adapters/github/githubtest, adapters/solr/solrtest). It is what
// net/http/httptest's Server does for them, without linking httptest (test
// support that registers a global -httptest.serve flag) into the binary,
// whose demo runs the emulators.
package loopback

import (
	"context"
	"fmt"
	"net"
	"net/http"
)

// Server is a running HTTP server on a loopback port.
type Server struct {
	// URL is the base URL, "http://127.0.0.1:<port>" (no trailing slash).
	URL string

	srv    *http.Server
	client *http.Client
	done   chan struct{} // closed when Serve has returned
}

// Start serves h on a free port of 127.0.0.1 (of [::1] when IPv4 has no
// loopback). It panics when it cannot listen, like httptest.NewServer.
func Start(h http.Handler) *Server {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		if l, err = net.Listen("tcp6", "[::1]:0"); err != nil {
			panic(fmt.Sprintf("loopback: failed to listen on a port: %v", err))
		}
	}
	s := &Server{
		URL:    "http://" + l.Addr().String(),
		srv:    &http.Server{Handler: h},
		client: &http.Client{Transport: &http.Transport{}},
		done:   make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(l)
	}()
	return s
}

// Client returns an HTTP client whose idle connections Close shuts down.
func (s *Server) Client() *http.Client { return s.client }

// Close stops listening, waits for the requests in flight to finish, closes
// every connection and the client's idle connections. Calling it again does
// nothing.
func (s *Server) Close() {
	_ = s.srv.Shutdown(context.Background())
	<-s.done
	s.client.CloseIdleConnections()
}
