package server_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func status(t *testing.T, h http.Handler, path string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

func TestProbes(t *testing.T) {
	s := server.New(nil, prometheus.NewRegistry())
	h := s.Handler()
	if c := status(t, h, "/-/healthy"); c != 200 {
		t.Fatalf("healthy while starting: %d", c)
	}
	if c := status(t, h, "/-/ready"); c != 503 {
		t.Fatalf("ready while starting: %d, want 503", c)
	}
	s.SetReady(true)
	if c := status(t, h, "/-/ready"); c != 200 {
		t.Fatalf("ready: %d", c)
	}
	if c := status(t, h, "/metrics"); c != 200 {
		t.Fatalf("metrics: %d", c)
	}
	_ = s.Shutdown(t.Context())
	if c := status(t, h, "/-/ready"); c != 503 {
		t.Fatalf("ready while stopping: %d, want 503", c)
	}
	if c := status(t, h, "/-/healthy"); c != 200 {
		t.Fatalf("healthy while stopping: %d", c)
	}
}
