// Package httpx is the HTTP plumbing the applications share: JSON answers,
// error answers and bearer-token checks. It sits below the applications so
// that controlplane and projection never duplicate it.
package httpx

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strings"
)

// WriteJSON answers status with v encoded as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ErrorBody is the JSON shape of every error answer.
type ErrorBody struct {
	Error string `json:"error"`
}

// Error answers status with {"error": msg}. msg must never carry a secret.
func Error(w http.ResponseWriter, status int, msg string) {
	WriteJSON(w, status, ErrorBody{Error: msg})
}

// TokenMatches compares a presented token with the expected one in constant
// time, over SHA-256 digests so that neither length nor content leaks.
func TokenMatches(presented, expected string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(expected))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && expected != ""
}

// BearerToken returns the token of an "Authorization: Bearer …" header.
func BearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// RequireBearer wraps next with a bearer check against token, counted
// against the client's budget in lim (GuessLimiter: wrong tokens per
// client address; one limiter may guard several routes, which then share
// each client's budget). An empty token means the route is not
// configured: 503 with the variable to set (named by setting). A missing
// or wrong token answers 401 with WWW-Authenticate; once the client's
// budget is spent, 429 with Retry-After and nothing compared.
func RequireBearer(token, setting string, lim *GuessLimiter, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token == "" {
			Error(w, http.StatusServiceUnavailable, "not configured: set "+setting)
			return
		}
		_, ok, wait := CheckBearer(lim, r, token)
		switch {
		case ok:
			next.ServeHTTP(w, r)
		case wait > 0:
			RetryAfter(w, wait)
			Error(w, http.StatusTooManyRequests, "too many wrong bearer tokens from your address; retry later")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox"`)
			Error(w, http.StatusUnauthorized, "missing or invalid bearer token")
		}
	})
}

// Mux is what applications mount routes on (an *http.ServeMux or the
// server's wrapper).
type Mux interface {
	Handle(pattern string, h http.Handler)
}

// OperatorMux is a Mux that serves operator routes (pages and data for
// operators: queue names, record ids, error text) apart from the others,
// behind the operator token or on the operator listener (internal/server).
type OperatorMux interface {
	Mux
	HandleOperator(pattern string, h http.Handler)
}

// HandleOperator mounts an operator route on m: with m's HandleOperator
// when m is an OperatorMux, else as any other route.
func HandleOperator(m Mux, pattern string, h http.Handler) {
	if om, ok := m.(OperatorMux); ok {
		om.HandleOperator(pattern, h)
		return
	}
	m.Handle(pattern, h)
}
