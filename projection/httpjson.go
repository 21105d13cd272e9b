package projection

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
)

// The HTTP plumbing every projection route shares: JSON answers, error
// answers and bearer checks.

// errorBody is every error answer: {"error": "..."} plus optional details.
type errorBody struct {
	Error string `json:"error"`
	// Line is the input line an error is about, when there is one.
	Line int64 `json:"line,omitempty"`
	// Result is what an import had committed before it stopped.
	Result *ImportResult `json:"result,omitempty"`
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(true)
	_ = enc.Encode(v)
}

// writeError answers {"error": msg} with status.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg})
}

// bearerMatches compares the request's bearer token with secret in constant
// time (SHA-256 digests of equal length, so neither the content nor the
// length of the secret leaks). An empty secret matches nothing.
func bearerMatches(r *http.Request, secret string) bool {
	if secret == "" {
		return false
	}
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[len(prefix):])))
	want := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// unauthorized answers 401 with a Bearer challenge.
func unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox"`)
	writeError(w, http.StatusUnauthorized, "missing or invalid bearer token")
}

// requireAPIToken guards the records API with PGOUTBOX_API_TOKEN: 503 "not
// configured" while it is unset, 401 for a missing or wrong token.
func (a *App) requireAPIToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.APIToken == "" {
			writeError(w, http.StatusServiceUnavailable, "not configured: set PGOUTBOX_API_TOKEN to enable the records API")
			return
		}
		if !bearerMatches(r, a.cfg.APIToken) {
			unauthorized(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}
