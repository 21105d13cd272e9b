package github

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// GitHub App authentication: the app JWT, private key parsing, and a cache of
// installation access tokens. Neither tokens nor keys ever appear in error
// text: errors carry the installation id, the HTTP status and GitHub's
// message (with any credential scrubbed), nothing else.

// DefaultAPIURL is the REST API root used when GITHUB_API_URL is unset.
// GitHub Enterprise Server uses https://HOST/api/v3; the emulator its own URL.
const DefaultAPIURL = "https://api.github.com"

// APIVersion is sent as X-GitHub-Api-Version on every request.
const APIVersion = "2022-11-28"

// Lifetimes of the credentials handled here.
const (
	// AppJWTBackdate is how far in the past an app JWT's iat is set, to allow
	// for clock drift between this host and GitHub (GitHub's recommendation).
	AppJWTBackdate = 60 * time.Second
	// AppJWTLifetime is how far in the future an app JWT's exp is set; GitHub
	// refuses an exp more than 10 minutes ahead.
	AppJWTLifetime = 9 * time.Minute
	// TokenRefreshMargin is how long before its expires_at a cached
	// installation token stops being used.
	TokenRefreshMargin = time.Minute
)

// Errors of the authentication layer.
var (
	// ErrInvalidPrivateKey is returned by [ParsePrivateKey] (and by
	// [AppJWT] and [NewTokenSource] for a nil key). Its text never contains
	// key material.
	ErrInvalidPrivateKey = errors.New("github: invalid GitHub App private key")
	// ErrInvalidAppID is returned for an empty app id.
	ErrInvalidAppID = errors.New("github: invalid GitHub App id")
)

// AppJWT returns a GitHub App JSON Web Token signed with RS256: iss = appID
// (the numeric app id or the app's client id), iat = now - [AppJWTBackdate],
// exp = now + [AppJWTLifetime]. It authenticates as the app itself, e.g. to
// create installation access tokens.
func AppJWT(appID string, key *rsa.PrivateKey, now time.Time) (string, error) {
	if strings.TrimSpace(appID) == "" {
		return "", ErrInvalidAppID
	}
	if key == nil {
		return "", fmt.Errorf("%w: no key", ErrInvalidPrivateKey)
	}
	claims := jwt.RegisteredClaims{
		Issuer:    appID,
		IssuedAt:  jwt.NewNumericDate(now.Add(-AppJWTBackdate)),
		ExpiresAt: jwt.NewNumericDate(now.Add(AppJWTLifetime)),
	}
	signed, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(key)
	if err != nil {
		// The signer's errors describe the key's shape, not its content.
		return "", fmt.Errorf("%w: cannot sign the app JWT", ErrInvalidPrivateKey)
	}
	return signed, nil
}

// ParsePrivateKey parses the PEM-encoded private key GitHub generates for an
// app ("RSA PRIVATE KEY", PKCS #1) or the same key converted to PKCS #8
// ("PRIVATE KEY"). Errors wrap [ErrInvalidPrivateKey] and never contain key
// material.
func ParsePrivateKey(pemBytes []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block found", ErrInvalidPrivateKey)
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		key, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: cannot parse the PKCS #1 key", ErrInvalidPrivateKey)
		}
		return key, nil
	case "PRIVATE KEY":
		parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: cannot parse the PKCS #8 key", ErrInvalidPrivateKey)
		}
		key, ok := parsed.(*rsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%w: the PKCS #8 key is not an RSA key", ErrInvalidPrivateKey)
		}
		return key, nil
	default:
		return nil, fmt.Errorf("%w: unsupported PEM block type %.40q", ErrInvalidPrivateKey, block.Type)
	}
}

// TokenError is returned by [TokenSource.Token] when GitHub answers the
// access-token request with something other than 201 and a valid token.
type TokenError struct {
	// InstallationID is the installation the token was requested for.
	InstallationID int64
	// StatusCode is the HTTP status (201 when the body was malformed).
	StatusCode int
	// Message is GitHub's "message" (bounded, credentials scrubbed) or a
	// description of what was wrong with the response.
	Message string
	// RetryAfter is the wait GitHub asked for via Retry-After (seconds or
	// an HTTP-date) or, when the rate limit is exhausted, x-ratelimit-reset
	// (a minute when the reset is unreadable); 0 when it asked for none.
	RetryAfter time.Duration
}

// Error implements error.
func (e *TokenError) Error() string {
	return fmt.Sprintf("github: installation %d access token: HTTP %d: %s", e.InstallationID, e.StatusCode, e.Message)
}

// Temporary reports whether retrying later may succeed: rate limiting, 5xx,
// or a malformed success response. 401, 404 and 422 are permanent (wrong app
// credentials, unknown installation), and so is 403 without a rate limit
// (e.g. a suspended installation).
func (e *TokenError) Temporary() bool {
	switch {
	case e.RetryAfter > 0, e.StatusCode == http.StatusTooManyRequests, e.StatusCode >= 500, e.StatusCode == http.StatusCreated:
		return true
	default:
		return false
	}
}

// TokenSource creates and caches installation access tokens. A token is
// reused until [TokenRefreshMargin] before its expires_at; concurrent callers
// for the same installation share one request. Tokens live only in memory.
// The zero value is not usable; use [NewTokenSource]. Safe for concurrent use.
type TokenSource struct {
	client *http.Client
	apiURL string
	appID  string
	key    *rsa.PrivateKey
	now    func() time.Time

	mu    sync.Mutex
	cache map[int64]*tokenSlot
}

type tokenSlot struct {
	token     string
	expiresAt time.Time
	fetch     *tokenFetch // non-nil while a request is in flight
}

type tokenFetch struct {
	done      chan struct{}
	token     string
	expiresAt time.Time
	err       error
	abandoned bool // the leading caller's context ended before the answer
}

// NewTokenSource returns a TokenSource for the app appID with private key
// key. client defaults to [http.DefaultClient] when nil (give it a timeout
// shorter than the delivery lease); apiURL defaults to [DefaultAPIURL] when
// empty; clock defaults to [time.Now] when nil.
func NewTokenSource(client *http.Client, apiURL, appID string, key *rsa.PrivateKey, clock func() time.Time) (*TokenSource, error) {
	if strings.TrimSpace(appID) == "" {
		return nil, ErrInvalidAppID
	}
	if key == nil {
		return nil, fmt.Errorf("%w: no key", ErrInvalidPrivateKey)
	}
	if client == nil {
		client = http.DefaultClient
	}
	if apiURL == "" {
		apiURL = DefaultAPIURL
	}
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("github: invalid API URL %.200q", apiURL)
	}
	if clock == nil {
		clock = time.Now
	}
	return &TokenSource{
		client: client,
		apiURL: strings.TrimRight(apiURL, "/"),
		appID:  appID,
		key:    key,
		now:    clock,
		cache:  make(map[int64]*tokenSlot),
	}, nil
}

// Token returns an installation access token for installationID, from the
// cache when it is valid for at least [TokenRefreshMargin] more, otherwise
// from POST {apiURL}/app/installations/{id}/access_tokens. A failed request
// is returned as a *[TokenError] (or a transport error) and is not cached.
func (s *TokenSource) Token(ctx context.Context, installationID int64) (string, error) {
	if installationID <= 0 {
		return "", fmt.Errorf("github: invalid installation id %d", installationID)
	}
	for {
		s.mu.Lock()
		slot := s.cache[installationID]
		if slot == nil {
			slot = &tokenSlot{}
			s.cache[installationID] = slot
		}
		if slot.token != "" && s.now().Before(slot.expiresAt.Add(-TokenRefreshMargin)) {
			token := slot.token
			s.mu.Unlock()
			return token, nil
		}
		if f := slot.fetch; f != nil {
			s.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			if f.abandoned && ctx.Err() == nil {
				continue // the leading caller gave up; take over
			}
			return f.token, f.err
		}
		f := &tokenFetch{done: make(chan struct{})}
		slot.fetch = f
		s.mu.Unlock()
		s.lead(ctx, installationID, slot, f)
		return f.token, f.err
	}
}

// lead performs the request of flight f and publishes its outcome to the
// callers waiting on it, even if the request panics.
func (s *TokenSource) lead(ctx context.Context, installationID int64, slot *tokenSlot, f *tokenFetch) {
	f.err = errors.New("github: access token request aborted")
	defer func() {
		s.mu.Lock()
		slot.fetch = nil
		if f.err == nil {
			slot.token, slot.expiresAt = f.token, f.expiresAt
		}
		s.mu.Unlock()
		close(f.done)
	}()
	f.token, f.expiresAt, f.err = s.fetch(ctx, installationID)
	f.abandoned = f.err != nil && ctx.Err() != nil
}

// Invalidate drops the cached token of installationID, e.g. after GitHub
// answered 401 to a request made with it.
func (s *TokenSource) Invalidate(installationID int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot := s.cache[installationID]; slot != nil {
		slot.token, slot.expiresAt = "", time.Time{}
	}
}

// tokenResponseLimit bounds the access-token response body read.
const tokenResponseLimit = 1 << 20

// tokenMessageLimit bounds GitHub's message copied into a TokenError.
const tokenMessageLimit = 256

func (s *TokenSource) fetch(ctx context.Context, installationID int64) (string, time.Time, error) {
	appJWT, err := AppJWT(s.appID, s.key, s.now())
	if err != nil {
		return "", time.Time{}, err
	}
	endpoint := s.apiURL + "/app/installations/" + strconv.FormatInt(installationID, 10) + "/access_tokens"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, nil)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("github: installation %d access token: cannot build the request", installationID)
	}
	req.Header.Set("Authorization", "Bearer "+appJWT)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", APIVersion)
	req.Header.Set("User-Agent", "pgoutbox")
	resp, err := s.client.Do(req)
	if err != nil {
		// *url.Error names the method and the URL (no credential) and the cause.
		return "", time.Time{}, fmt.Errorf("github: installation %d access token: %w", installationID, err)
	}
	defer resp.Body.Close()
	body, readErr := io.ReadAll(io.LimitReader(resp.Body, tokenResponseLimit))

	tokenErr := func(message string) *TokenError {
		return &TokenError{
			InstallationID: installationID,
			StatusCode:     resp.StatusCode,
			Message:        tokenScrub(message, appJWT),
			RetryAfter:     tokenRetryAfter(resp.Header, s.now()),
		}
	}
	if resp.StatusCode != http.StatusCreated {
		var apiErr struct {
			Message string `json:"message"`
		}
		message := http.StatusText(resp.StatusCode)
		if json.Unmarshal(body, &apiErr) == nil && apiErr.Message != "" {
			message = apiErr.Message
		}
		return "", time.Time{}, tokenErr(message)
	}
	if readErr != nil {
		return "", time.Time{}, fmt.Errorf("github: installation %d access token: reading the response: %w", installationID, readErr)
	}
	var created struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(body, &created); err != nil {
		return "", time.Time{}, tokenErr("malformed access token response")
	}
	if created.Token == "" || created.ExpiresAt.IsZero() {
		return "", time.Time{}, tokenErr("access token response without token or expires_at")
	}
	return created.Token, created.ExpiresAt, nil
}

// tokenScrub bounds message and removes any credential from it.
func tokenScrub(message string, secrets ...string) string {
	for _, s := range secrets {
		if s != "" {
			message = strings.ReplaceAll(message, s, "[redacted]")
		}
	}
	if len(message) > tokenMessageLimit {
		message = strings.ToValidUTF8(message[:tokenMessageLimit], "") + "…"
	}
	return message
}

// tokenRetryAfter is the wait GitHub asked for (rateLimitWait), 0 when none.
func tokenRetryAfter(h http.Header, now time.Time) time.Duration {
	d, _ := rateLimitWait(h, now)
	return d
}
