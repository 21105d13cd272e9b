package github_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

// TestMain checks every test of package github for leaked goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var testKey = sync.OnceValue(func() *rsa.PrivateKey {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return key
})

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestAppJWT(t *testing.T) {
	t.Parallel()
	key := testKey()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	signed, err := github.AppJWT("12345", key, now)
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.MapClaims{}
	tok, err := jwt.ParseWithClaims(signed, claims, func(*jwt.Token) (any, error) { return &key.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(func() time.Time { return now }))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if tok.Header["alg"] != "RS256" {
		t.Errorf("alg = %v", tok.Header["alg"])
	}
	if claims["iss"] != "12345" {
		t.Errorf("iss = %v", claims["iss"])
	}
	if iat := claims["iat"].(float64); int64(iat) != now.Add(-60*time.Second).Unix() {
		t.Errorf("iat = %v, want now-60s", iat)
	}
	if exp := claims["exp"].(float64); int64(exp) != now.Add(9*time.Minute).Unix() {
		t.Errorf("exp = %v, want now+9m", exp)
	}
	if _, err := github.AppJWT("", key, now); !errors.Is(err, github.ErrInvalidAppID) {
		t.Errorf("empty app id: %v", err)
	}
	if _, err := github.AppJWT("1", nil, now); !errors.Is(err, github.ErrInvalidPrivateKey) {
		t.Errorf("nil key: %v", err)
	}
}

func TestParsePrivateKey(t *testing.T) {
	t.Parallel()
	key := testKey()
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	pkcs8DER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8 := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8DER})
	for name, p := range map[string][]byte{"PKCS #1": pkcs1, "PKCS #8": pkcs8, "with surrounding text": append([]byte("key:\n"), pkcs1...)} {
		got, err := github.ParsePrivateKey(p)
		if err != nil || !got.Equal(key) {
			t.Errorf("%s: %v", name, err)
		}
	}

	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKCS8PrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	const canary = "CANARY-KEY-MATERIAL-0xDEADBEEF"
	bad := map[string][]byte{
		"empty":            nil,
		"not PEM":          []byte(canary),
		"EC key":           pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecDER}),
		"garbage PKCS #1":  pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte(canary)}),
		"garbage PKCS #8":  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte(canary)}),
		"public key block": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte(canary)}),
	}
	for name, p := range bad {
		_, err := github.ParsePrivateKey(p)
		if !errors.Is(err, github.ErrInvalidPrivateKey) {
			t.Errorf("%s: err = %v", name, err)
			continue
		}
		if strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), "Q0FOQVJZ") {
			t.Errorf("%s: error %q leaks key material", name, err)
		}
	}
}

// fakeTokenAPI is a minimal access-token endpoint whose answers a test
// scripts; it verifies the request like GitHub does.
type fakeTokenAPI struct {
	t        *testing.T
	key      *rsa.PublicKey
	now      func() time.Time
	requests atomic.Int32
	arrived  chan struct{} // receives on every request when non-nil
	answer   func(w http.ResponseWriter, r *http.Request, n int)
}

func (f *fakeTokenAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(f.requests.Add(1))
	if f.arrived != nil {
		f.arrived <- struct{}{}
	}
	auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	_, err := jwt.Parse(auth, func(*jwt.Token) (any, error) { return f.key, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(f.now), jwt.WithExpirationRequired(), jwt.WithIssuer("12345"))
	if r.Method != http.MethodPost || !ok || err != nil ||
		r.Header.Get("Accept") != "application/vnd.github+json" ||
		r.Header.Get("X-GitHub-Api-Version") != "2022-11-28" {
		f.t.Errorf("request %s %s: auth ok %v, jwt err %v, headers %v", r.Method, r.URL.Path, ok, err, r.Header)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	f.answer(w, r, n)
}

func tokenAnswer(token string, expiresAt time.Time) func(http.ResponseWriter, *http.Request, int) {
	return func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"token":%q,"expires_at":%q,"permissions":{"checks":"write"}}`, token, expiresAt.UTC().Format(time.RFC3339))
	}
}

func setupTokenSource(t *testing.T, api *fakeTokenAPI) (*github.TokenSource, *testClock, *httptest.Server) {
	t.Helper()
	clock := &testClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	api.t, api.key, api.now = t, &testKey().PublicKey, clock.Now
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	ts, err := github.NewTokenSource(srv.Client(), srv.URL+"/", "12345", testKey(), clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	return ts, clock, srv
}

func TestTokenSourceCachesUntilAMinuteBeforeExpiry(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var paths sync.Map
	api := &fakeTokenAPI{}
	api.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		paths.Store(r.URL.Path, true)
		tokenAnswer(fmt.Sprintf("ghs_token%d", n), start.Add(time.Hour))(w, r, n)
	}
	ts, clock, _ := setupTokenSource(t, api)
	ctx := t.Context()

	tok, err := ts.Token(ctx, 42)
	if err != nil || tok != "ghs_token1" {
		t.Fatalf("Token = %q, %v", tok, err)
	}
	if _, ok := paths.Load("/app/installations/42/access_tokens"); !ok {
		t.Fatal("the token was not requested at /app/installations/42/access_tokens")
	}
	clock.Advance(58*time.Minute + 59*time.Second)
	if tok, err := ts.Token(ctx, 42); err != nil || tok != "ghs_token1" || api.requests.Load() != 1 {
		t.Fatalf("before the margin: %q, %v, %d requests", tok, err, api.requests.Load())
	}
	clock.Advance(time.Second) // exactly one minute before expires_at
	if tok, err := ts.Token(ctx, 42); err != nil || tok != "ghs_token2" {
		t.Fatalf("at the margin: %q, %v", tok, err)
	}
	// Installations are cached separately.
	if tok, err := ts.Token(ctx, 43); err != nil || tok != "ghs_token3" {
		t.Fatalf("other installation: %q, %v", tok, err)
	}
	ts.Invalidate(42)
	if tok, err := ts.Token(ctx, 42); err != nil || tok != "ghs_token4" {
		t.Fatalf("after Invalidate: %q, %v", tok, err)
	}
	if _, err := ts.Token(ctx, 0); err == nil {
		t.Fatal("installation id 0 was accepted")
	}
}

func TestTokenSourceSharesOneRequest(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	api := &fakeTokenAPI{arrived: make(chan struct{}, 100)}
	api.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		tokenAnswer("ghs_shared", time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC))(w, r, n)
	}
	ts, _, _ := setupTokenSource(t, api)

	const callers = 20
	var wg sync.WaitGroup
	results := make(chan string, callers)
	for range callers {
		wg.Go(func() {
			tok, err := ts.Token(context.Background(), 7)
			if err != nil {
				t.Error(err)
			}
			results <- tok
		})
	}
	<-api.arrived // the first request is in flight; the others join it or hit the cache
	close(release)
	wg.Wait()
	close(results)
	for tok := range results {
		if tok != "ghs_shared" {
			t.Fatalf("token %q", tok)
		}
	}
	if n := api.requests.Load(); n != 1 {
		t.Fatalf("%d requests for %d concurrent callers, want 1", n, callers)
	}
}

func TestTokenSourceWaiterTakesOverFromCancelledLeader(t *testing.T) {
	t.Parallel()
	api := &fakeTokenAPI{arrived: make(chan struct{}, 10)}
	api.answer = func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-r.Context().Done() // hold the first request until its caller gives up
			return
		}
		tokenAnswer("ghs_second", time.Date(2026, 3, 1, 13, 0, 0, 0, time.UTC))(w, r, n)
	}
	ts, _, _ := setupTokenSource(t, api)

	leaderCtx, cancelLeader := context.WithCancel(t.Context())
	leaderErr := make(chan error, 1)
	go func() {
		_, err := ts.Token(leaderCtx, 9)
		leaderErr <- err
	}()
	<-api.arrived
	waiter := make(chan string, 1)
	go func() {
		tok, err := ts.Token(context.Background(), 9)
		if err != nil {
			t.Error(err)
		}
		waiter <- tok
	}()
	cancelLeader()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("leader: %v", err)
	}
	if tok := <-waiter; tok != "ghs_second" {
		t.Fatalf("waiter got %q", tok)
	}
}

func TestTokenSourceErrorsNeverLeakCredentials(t *testing.T) {
	t.Parallel()
	const canary = "ghs_CANARYCANARYCANARYCANARYCANARY00000"
	var seenJWT atomic.Value
	tests := []struct {
		name      string
		answer    func(http.ResponseWriter, *http.Request, int)
		status    int
		temporary bool
		retry     time.Duration
	}{
		{
			name: "401 echoing the JWT", status: 401,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				jwt := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
				seenJWT.Store(jwt)
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"message":"A JSON web token could not be decoded: %s","documentation_url":"https://docs.github.com/rest"}`, jwt)
			},
		},
		{
			name: "201 with a malformed expires_at", status: 201, temporary: true,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"token":%q,"expires_at":"soon"}`, canary)
			},
		},
		{
			name: "201 without expires_at", status: 201, temporary: true,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"token":%q}`, canary)
			},
		},
		{
			name: "403 rate limited", status: 403, temporary: true, retry: 90 * time.Second,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.Header().Set("X-RateLimit-Remaining", "0")
				w.Header().Set("X-RateLimit-Reset", fmt.Sprint(time.Date(2026, 3, 1, 12, 1, 30, 0, time.UTC).Unix()))
				w.WriteHeader(http.StatusForbidden)
				fmt.Fprint(w, `{"message":"API rate limit exceeded for app ID 12345."}`)
			},
		},
		{
			name: "429 with Retry-After", status: 429, temporary: true, retry: 30 * time.Second,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.Header().Set("Retry-After", "30")
				w.WriteHeader(http.StatusTooManyRequests)
			},
		},
		{
			name: "429 with an HTTP-date Retry-After", status: 429, temporary: true, retry: 45 * time.Second,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.Header().Set("Retry-After", "Sun, 01 Mar 2026 12:00:45 GMT")
				w.WriteHeader(http.StatusTooManyRequests)
			},
		},
		{
			name: "403 with an HTTP-date Retry-After", status: 403, temporary: true, retry: 2 * time.Minute,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.Header().Set("Retry-After", "Sunday, 01-Mar-26 12:02:00 GMT")
				w.WriteHeader(http.StatusForbidden)
			},
		},
		{
			name: "404 unknown installation", status: 404,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, `{"message":"Not Found"}`)
			},
		},
		{
			name: "502 HTML", status: 502, temporary: true,
			answer: func(w http.ResponseWriter, r *http.Request, _ int) {
				w.WriteHeader(http.StatusBadGateway)
				fmt.Fprint(w, `<html>bad gateway</html>`)
			},
		},
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(testKey())})
	keyBody := strings.Split(string(keyPEM), "\n")[1] // a line of base64 key material
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts, _, _ := setupTokenSource(t, &fakeTokenAPI{answer: tt.answer})
			_, err := ts.Token(t.Context(), 5)
			var tokenErr *github.TokenError
			if !errors.As(err, &tokenErr) {
				t.Fatalf("err = %v, want a *TokenError", err)
			}
			if tokenErr.StatusCode != tt.status || tokenErr.InstallationID != 5 || tokenErr.Temporary() != tt.temporary || tokenErr.RetryAfter != tt.retry {
				t.Fatalf("TokenError = %+v (temporary %v)", tokenErr, tokenErr.Temporary())
			}
			text := err.Error()
			secrets := []string{canary, keyBody}
			if jwt, ok := seenJWT.Load().(string); ok && jwt != "" {
				secrets = append(secrets, jwt, strings.Split(jwt, ".")[2])
			}
			for _, secret := range secrets {
				if strings.Contains(text, secret) {
					t.Fatalf("error text %q leaks a credential", text)
				}
			}
		})
	}
}

func TestTokenSourceAgainstEmulator(t *testing.T) {
	t.Parallel()
	gh := fakegh.New(fakegh.Options{})
	t.Cleanup(gh.Close)
	if err := gh.AddInstallation(77, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := gh.AddRepository(77, 700, "acme/widgets"); err != nil {
		t.Fatal(err)
	}
	key, err := github.ParsePrivateKey(gh.AppPrivateKeyPEM())
	if err != nil {
		t.Fatal(err)
	}
	ts, err := github.NewTokenSource(gh.Client(), gh.URL(), gh.AppID(), key, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ts.Token(t.Context(), 77)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, gh.URL()+"/repos/acme/widgets/commits/main/check-runs", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := gh.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("using the token: HTTP %d", resp.StatusCode)
	}
	// The emulator refuses a token request for an unknown installation.
	var tokenErr *github.TokenError
	if _, err := ts.Token(t.Context(), 78); !errors.As(err, &tokenErr) || tokenErr.StatusCode != http.StatusNotFound || tokenErr.Temporary() {
		t.Fatalf("unknown installation: %v", err)
	}
	if calls := gh.Calls(); len(calls) != 3 || calls[0].Route != fakegh.RouteCreateInstallationToken || calls[0].Status != http.StatusCreated {
		t.Fatalf("calls = %+v", calls)
	}
}

func TestNewTokenSourceValidation(t *testing.T) {
	t.Parallel()
	if _, err := github.NewTokenSource(nil, "", "", testKey(), nil); !errors.Is(err, github.ErrInvalidAppID) {
		t.Errorf("empty app id: %v", err)
	}
	if _, err := github.NewTokenSource(nil, "", "1", nil, nil); !errors.Is(err, github.ErrInvalidPrivateKey) {
		t.Errorf("nil key: %v", err)
	}
	if _, err := github.NewTokenSource(nil, "ftp://example.com", "1", testKey(), nil); err == nil {
		t.Error("an ftp API URL was accepted")
	}
	if _, err := github.NewTokenSource(nil, "", "1", testKey(), nil); err != nil {
		t.Errorf("defaults: %v", err)
	}
}
