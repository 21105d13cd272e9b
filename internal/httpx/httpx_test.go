package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

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
		httpx.RequireBearer(tc.token, "PGOUTBOX_API_TOKEN", ok).ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("token %q header %q: %d, want %d", tc.token, tc.header, rec.Code, tc.want)
		}
		if rec.Code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
			t.Error("401 without WWW-Authenticate")
		}
	}
}
