package githubtest_test

import (
	"crypto/rand"
	"crypto/rsa"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

func TestInstallationTokenIssuance(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	now := b.clock.Now()

	resp := b.do(t, http.MethodPost, "/app/installations/100/access_tokens", b.jwt(t), nil)
	if resp.status != http.StatusCreated {
		t.Fatalf("HTTP %d %s", resp.status, resp.body)
	}
	var tok struct {
		Token       string            `json:"token"`
		ExpiresAt   time.Time         `json:"expires_at"`
		Permissions map[string]string `json:"permissions"`
	}
	resp.decode(t, &tok)
	if len(tok.Token) != 40 || tok.Token[:4] != "ghs_" {
		t.Errorf("token %q is not shaped like ghs_…", tok.Token)
	}
	if !tok.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("expires_at = %v, want %v", tok.ExpiresAt, now.Add(time.Hour))
	}
	if tok.Permissions["checks"] != "write" || tok.Permissions["actions"] != "write" {
		t.Errorf("permissions = %v", tok.Permissions)
	}
	if tok.Token == b.token {
		t.Error("two requests returned the same token")
	}

	// The token works; "token X" is accepted as well as "Bearer X".
	req, err := http.NewRequest(http.MethodGet, b.srv.URL()+"/repos/acme/widgets/commits/main/check-runs", nil)
	must(t, err)
	req.Header.Set("Authorization", "token "+tok.Token)
	r, err := b.srv.Client().Do(req)
	must(t, err)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("token scheme: HTTP %d", r.StatusCode)
	}
}

func TestInstallationTokenRejections(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	now := b.clock.Now()
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	sign := func(key *rsa.PrivateKey, claims jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(key)
		must(t, err)
		return s
	}
	good := func() jwt.MapClaims {
		return jwt.MapClaims{"iss": b.srv.AppID(), "iat": now.Add(-time.Minute).Unix(), "exp": now.Add(9 * time.Minute).Unix()}
	}
	with := func(k string, v any) jwt.MapClaims {
		c := good()
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	appID, _ := strconv.Atoi(b.srv.AppID())
	hs256, err := jwt.NewWithClaims(jwt.SigningMethodHS256, good()).SignedString([]byte("k"))
	must(t, err)
	must(t, b.srv.SuspendInstallation(otherInstID, true))

	tests := []struct {
		name       string
		path       string
		credential string
		status     int
		message    string
	}{
		{"numeric iss accepted", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("iss", appID)), http.StatusCreated, ""},
		{"no credentials", "/app/installations/100/access_tokens", "", http.StatusUnauthorized, "Requires authentication"},
		{"other key", "/app/installations/100/access_tokens", sign(otherKey, good()), http.StatusUnauthorized, "A JSON web token could not be decoded"},
		{"HS256", "/app/installations/100/access_tokens", hs256, http.StatusUnauthorized, "A JSON web token could not be decoded"},
		{"installation token", "/app/installations/100/access_tokens", b.token, http.StatusUnauthorized, "A JSON web token could not be decoded"},
		{"wrong iss", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("iss", "999")), http.StatusUnauthorized, "A JSON web token could not be decoded"},
		{"no iss", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("iss", nil)), http.StatusUnauthorized, "'Issuer' claim ('iss') must be an Integer"},
		{"expired", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("exp", now.Add(-time.Second).Unix())), http.StatusUnauthorized, "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires"},
		{"no exp", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("exp", nil)), http.StatusUnauthorized, "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires"},
		{"exp too far", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("exp", now.Add(11*time.Minute).Unix())), http.StatusUnauthorized, "'Expiration time' claim ('exp') is too far in the future"},
		{"iat in the future", "/app/installations/100/access_tokens", sign(b.srv.AppPrivateKey(), with("iat", now.Add(2*time.Minute).Unix())), http.StatusUnauthorized, "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"},
		{"unknown installation", "/app/installations/999/access_tokens", b.jwt(t), http.StatusNotFound, "Not Found"},
		{"suspended installation", "/app/installations/200/access_tokens", b.jwt(t), http.StatusForbidden, "This installation has been suspended"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := b.do(t, http.MethodPost, tt.path, tt.credential, nil)
			if resp.status != tt.status {
				t.Fatalf("HTTP %d %s, want %d", resp.status, resp.body, tt.status)
			}
			if tt.message != "" {
				if got := resp.message(t); got != tt.message {
					t.Fatalf("message %q, want %q", got, tt.message)
				}
				var e struct {
					DocumentationURL string `json:"documentation_url"`
					Status           string `json:"status"`
				}
				resp.decode(t, &e)
				if e.DocumentationURL == "" || e.Status != strconv.Itoa(tt.status) {
					t.Fatalf("error body %s lacks documentation_url/status", resp.body)
				}
			}
		})
	}
}

func TestTokenScopedRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	const list = "/repos/acme/widgets/commits/main/check-runs"

	tests := []struct {
		name       string
		path       string
		credential string
		status     int
		message    string
	}{
		{"valid", list, b.token, http.StatusOK, ""},
		{"repository name is case-insensitive", "/repos/ACME/Widgets/commits/main/check-runs", b.token, http.StatusOK, ""},
		{"missing", list, "", http.StatusUnauthorized, "Requires authentication"},
		{"never issued", list, "ghs_000000000000000000000000000000000000", http.StatusUnauthorized, "Bad credentials"},
		{"app JWT", list, b.jwt(t), http.StatusUnauthorized, "Bad credentials"},
		{"other installation's repository", "/repos/rival/gadgets/commits/main/check-runs", b.token, http.StatusNotFound, "Not Found"},
		{"unknown repository", "/repos/acme/nope/commits/main/check-runs", b.token, http.StatusNotFound, "Not Found"},
		{"unknown route", "/repos/acme/widgets/pulls", b.token, http.StatusNotFound, "Not Found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := b.do(t, http.MethodGet, tt.path, tt.credential, nil)
			if resp.status != tt.status {
				t.Fatalf("HTTP %d %s, want %d", resp.status, resp.body, tt.status)
			}
			if tt.message != "" && resp.message(t) != tt.message {
				t.Fatalf("message %q, want %q", resp.message(t), tt.message)
			}
		})
	}

	// An expired token is refused.
	b.clock.Advance(time.Hour)
	if resp := b.do(t, http.MethodGet, list, b.token, nil); resp.status != http.StatusUnauthorized || resp.message(t) != "Bad credentials" {
		t.Fatalf("expired token: HTTP %d %s", resp.status, resp.body)
	}
}

func TestTokenRepositoryScopeAndPermissions(t *testing.T) {
	t.Parallel()
	b := setup(t, fakegh.Options{})
	must(t, b.srv.AddRepository(installationID, 1002, "acme/other"))

	resp := b.do(t, http.MethodPost, "/app/installations/100/access_tokens", b.jwt(t),
		map[string]any{"repositories": []string{"other"}, "permissions": map[string]string{"checks": "read"}})
	if resp.status != http.StatusCreated {
		t.Fatalf("HTTP %d %s", resp.status, resp.body)
	}
	var tok struct {
		Token        string `json:"token"`
		Repositories []struct {
			FullName string `json:"full_name"`
		} `json:"repositories"`
	}
	resp.decode(t, &tok)
	if len(tok.Repositories) != 1 || tok.Repositories[0].FullName != "acme/other" {
		t.Fatalf("repositories = %+v", tok.Repositories)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/widgets/commits/main/check-runs", tok.Token, nil); r.status != http.StatusNotFound {
		t.Errorf("repository outside the token's scope: HTTP %d", r.status)
	}
	if r := b.do(t, http.MethodGet, "/repos/acme/other/commits/main/check-runs", tok.Token, nil); r.status != http.StatusOK {
		t.Errorf("repository in scope: HTTP %d", r.status)
	}
	r := b.do(t, http.MethodPost, "/repos/acme/other/check-runs", tok.Token, map[string]any{"name": "x", "head_sha": sha})
	if r.status != http.StatusForbidden || r.message(t) != "Resource not accessible by integration" {
		t.Errorf("write with a read token: HTTP %d %s", r.status, r.body)
	}
	if r := b.do(t, http.MethodPost, "/app/installations/100/access_tokens", b.jwt(t),
		map[string]any{"repository_ids": []int64{2001}}); r.status != http.StatusUnprocessableEntity {
		t.Errorf("another installation's repository id: HTTP %d", r.status)
	}
	if r := b.do(t, http.MethodPost, "/app/installations/100/access_tokens", b.jwt(t),
		map[string]any{"permissions": map[string]string{"administration": "write"}}); r.status != http.StatusUnprocessableEntity {
		t.Errorf("permission beyond the installation's: HTTP %d", r.status)
	}
}
