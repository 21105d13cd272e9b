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

func get(t *testing.T, h http.Handler, path, token string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
		t.Errorf("%s: 401 without WWW-Authenticate", path)
	}
	return rec.Code
}

// TestOperatorRoutes pins where /metrics and an application's operator
// route are served and how they are guarded, for each combination of
// OperatorToken and SeparateOperator; application routes and probes are
// never guarded.
func TestOperatorRoutes(t *testing.T) {
	const token = "op-token-7c1d"
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, c := range []struct {
		name string
		opts server.Options
		// main and operator listener answers to /metrics and /workers:
		// without a token, with a wrong one, with the right one.
		main, op [3]int
	}{
		{"default", server.Options{}, [3]int{200, 200, 200}, [3]int{200, 200, 200}},
		{"token", server.Options{OperatorToken: token}, [3]int{401, 401, 200}, [3]int{401, 401, 200}},
		{"separate", server.Options{SeparateOperator: true}, [3]int{404, 404, 404}, [3]int{200, 200, 200}},
		{"separate+token", server.Options{OperatorToken: token, SeparateOperator: true}, [3]int{404, 404, 404}, [3]int{401, 401, 200}},
	} {
		s := server.NewWithOptions(nil, prometheus.NewRegistry(), c.opts)
		s.HandleOperator("GET /workers", ok)
		s.Handle("GET /api/thing", ok)
		for _, path := range []string{"/metrics", "/workers"} {
			for i, tok := range []string{"", "wrong", token} {
				if got := get(t, s.Handler(), path, tok); got != c.main[i] {
					t.Errorf("%s: main %s (token %q): %d, want %d", c.name, path, tok, got, c.main[i])
				}
				if got := get(t, s.OperatorHandler(), path, tok); got != c.op[i] {
					t.Errorf("%s: operator %s (token %q): %d, want %d", c.name, path, tok, got, c.op[i])
				}
			}
		}
		// A self-authenticating operator route (the console) is placed
		// like the others but never gets the bearer check: a browser
		// reaches its sign-in without a header.
		s.HandleOperatorSelfAuth("GET /console/", ok)
		wantMain := 200
		if c.opts.SeparateOperator {
			wantMain = 404
		}
		if got := get(t, s.Handler(), "/console/", ""); got != wantMain {
			t.Errorf("%s: main /console/ without a token: %d, want %d", c.name, got, wantMain)
		}
		if got := get(t, s.OperatorHandler(), "/console/", ""); got != 200 {
			t.Errorf("%s: operator /console/ without a token: %d, want 200 (it authenticates itself)", c.name, got)
		}
		if get(t, s.Handler(), "/api/thing", "") != 200 || get(t, s.OperatorHandler(), "/api/thing", token) != 404 {
			t.Errorf("%s: application routes belong to the main listener only", c.name)
		}
		for _, h := range []http.Handler{s.Handler(), s.OperatorHandler()} {
			if get(t, h, "/-/healthy", "") != 200 {
				t.Errorf("%s: probes need no token", c.name)
			}
		}
	}
}
