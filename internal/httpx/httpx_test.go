package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRequireBearer(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	cases := []struct {
		token, header string
		want          int
	}{
		{"", "Bearer x", 503},
		{"s3cret", "", 401},
		{"s3cret", "Bearer wrong", 401},
		{"s3cret", "Basic s3cret", 401},
		{"s3cret", "Bearer s3cret", 204},
		{"s3cret", "bearer s3cret", 204},
	}
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		httpx.RequireBearer(tc.token, "PGOUTBOX_API_TOKEN", httpx.NewGuessLimiter(0, 0, nil), ok).ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("token %q header %q: %d, want %d", tc.token, tc.header, rec.Code, tc.want)
		}
		if rec.Code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
}

// Wrong bearer tokens are counted per client address: past the budget the
// route answers 429 with Retry-After and compares nothing, not even the
// right token from that address, while another address is still served.
func TestRequireBearerLimitsGuesses(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(204) })
	h := httpx.RequireBearer("s3cret", "PGOUTBOX_API_TOKEN", httpx.NewGuessLimiter(3, time.Hour, nil), ok)
	do := func(addr, token string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = addr + ":4711"
		req.Header.Set("Authorization", "Bearer "+token)
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range 3 {
		if rec := do("192.0.2.1", "guess"); rec.Code != 401 {
			t.Fatalf("wrong token %d: %d, want 401", i+1, rec.Code)
		}
	}
	rec := do("192.0.2.1", "s3cret")
	if rec.Code != 429 || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("right token after the budget: %d (Retry-After %q), want 429 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := do("192.0.2.2", "s3cret"); rec.Code != 204 {
		t.Fatalf("another address: %d, want 204", rec.Code)
	}
}
