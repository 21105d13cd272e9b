package githubtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
)

const (
	installationID = int64(100)
	otherInstID    = int64(200)
	repoName       = "acme/widgets"
	otherRepoName  = "rival/gadgets"
	sha            = "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type bundle struct {
	srv   *fakegh.Server
	clock *clock
	token string // an installation token of installationID
}

// setup starts an emulator with two installations, one repository each, and
// a token for the first one obtained over HTTP with an app JWT.
func setup(t *testing.T, opts fakegh.Options) bundle {
	t.Helper()
	c := newClock()
	if opts.Clock == nil {
		opts.Clock = c.Now
	}
	srv := fakegh.New(opts)
	t.Cleanup(srv.Close)
	must(t, srv.AddInstallation(installationID, "acme"))
	must(t, srv.AddInstallation(otherInstID, "rival"))
	must(t, srv.AddRepository(installationID, 1001, repoName))
	must(t, srv.AddRepository(otherInstID, 2001, otherRepoName))
	b := bundle{srv: srv, clock: c}
	resp := b.do(t, http.MethodPost, "/app/installations/100/access_tokens", b.jwt(t), nil)
	if resp.status != http.StatusCreated {
		t.Fatalf("token: HTTP %d %s", resp.status, resp.body)
	}
	var tok struct {
		Token string `json:"token"`
	}
	resp.decode(t, &tok)
	b.token = tok.Token
	return b
}

func (b bundle) jwt(t *testing.T) string {
	t.Helper()
	jwt, err := github.AppJWT(b.srv.AppID(), b.srv.AppPrivateKey(), b.clock.Now())
	must(t, err)
	return jwt
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}

func (r response) message(t *testing.T) string {
	t.Helper()
	var e struct {
		Message string `json:"message"`
	}
	r.decode(t, &e)
	return e.Message
}

// do sends a request with "Authorization: Bearer credential" (none when
// credential is empty) and a JSON body (none when body is nil).
func (b bundle) do(t *testing.T, method, path, credential string, body any) response {
	t.Helper()
	resp, err := b.send(context.Background(), method, path, credential, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

func (b bundle) send(ctx context.Context, method, path, credential string, body any) (response, error) {
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.srv.URL()+path, r)
	if err != nil {
		return response{}, err
	}
	if credential != "" {
		req.Header.Set("Authorization", "Bearer "+credential)
	}
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", github.APIVersion)
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: raw}, err
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, srv *fakegh.Server, what string, cond func(fakegh.Snapshot) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func mustToken(t *testing.T, srv *fakegh.Server, id int64) string {
	t.Helper()
	tok, _, err := srv.IssueToken(id)
	must(t, err)
	return tok
}
