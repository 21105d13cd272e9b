package githubtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/adapters/internal/loopback"
)

// Defaults of [Options].
const (
	// AppIDDefault is the app id used when Options.AppID is empty.
	AppIDDefault = "1"
	// AppSlugDefault is the app slug used when Options.AppSlug is empty.
	AppSlugDefault = "pgoutbox-emulated"
	// TokenTTLDefault is the lifetime of installation tokens (GitHub: 1 h).
	TokenTTLDefault = time.Hour
	// RateLimitDefault is the primary rate limit per installation and hour
	// (GitHub's minimum for an app installation).
	RateLimitDefault = 5000
	// ClockSkewDefault is how far in the future a JWT's iat may be.
	ClockSkewDefault = 30 * time.Second
	// HTMLURLDefault is the web root used for html_url fields.
	HTMLURLDefault = "https://github.com"
	// WebhookTimeoutDefault bounds one webhook delivery.
	WebhookTimeoutDefault = 10 * time.Second
	// APIVersion is the only X-GitHub-Api-Version accepted (an absent header
	// selects it too).
	APIVersion = "2022-11-28"
	// MaxWorkflowInputs is the number of inputs a workflow dispatch may carry.
	MaxWorkflowInputs = 25
)

// Options configure a [Server]. The zero value is usable.
type Options struct {
	// AppID is the GitHub App id, the JWT's expected iss. Default AppIDDefault.
	AppID string
	// ClientID, when set, is accepted as the JWT's iss as well (GitHub
	// accepts the app's client id). Default: none.
	ClientID string
	// AppSlug is the app's slug, shown in check runs. Default AppSlugDefault.
	AppSlug string
	// AppKey is the app's private key; the emulator verifies JWTs with its
	// public half. Default: a 2048-bit key generated once per process and
	// shared by every Server that does not set one.
	AppKey *rsa.PrivateKey
	// Clock returns the emulator's notion of now (token expiry, JWT checks,
	// timestamps, the call log, rate-limit windows). Default time.Now.
	Clock func() time.Time
	// ClockSkew is how far in the future a JWT's iat may be. Default
	// ClockSkewDefault.
	ClockSkew time.Duration
	// TokenTTL is the lifetime of issued installation tokens. Default
	// TokenTTLDefault.
	TokenTTL time.Duration
	// RateLimit is the primary rate limit per installation (and for the app)
	// per hour. Default RateLimitDefault.
	RateLimit int
	// RateLimitStatus is the status of a primary rate-limit refusal, 403 or
	// 429. Default 403.
	RateLimitStatus int
	// Delay is added before every call is handled (a "slow GitHub"); it
	// honours the request's context. Default 0. See also SetDelay.
	Delay time.Duration
	// RequireKnownRefs makes a dispatch or check-run listing on a ref that
	// was never registered (AddRepository's default branch, SetRef, Push)
	// fail with 422 as GitHub does. Default false: unknown refs resolve to a
	// deterministic synthetic SHA.
	RequireKnownRefs bool
	// NoReleaseWorkflow stops AddRepository from registering
	// ReleaseWorkflow(). Default false.
	NoReleaseWorkflow bool
	// HTMLURL is the web root of html_url fields. Default HTMLURLDefault.
	HTMLURL string
	// WebhookURL receives webhook deliveries. Default: none (no deliveries).
	WebhookURL string
	// WebhookSecret signs webhook deliveries. Required with WebhookURL.
	WebhookSecret []byte
	// WebhookClient sends webhook deliveries. Default: a client owned by the
	// Server with a WebhookTimeoutDefault timeout, closed by Close.
	WebhookClient *http.Client
	// HookID is sent as X-GitHub-Hook-ID. Default 1.
	HookID int64
}

// Server is a running GitHub emulator. Create it with [New].
type Server struct {
	opts       Options
	key        *rsa.PrivateKey
	ts         *loopback.Server
	handler    http.Handler
	hookClient *http.Client
	ownsClient bool

	mu            sync.Mutex
	changed       chan struct{} // closed and replaced on every state change
	delay         time.Duration
	installations map[int64]*installation
	repos         map[string]*repository // key: lower-case full name
	reposByID     map[int64]*repository
	tokens        map[string]*issuedToken
	buckets       map[string]*rateBucket
	faults        []*faultState
	checkRuns     []*CheckRun
	checkSuites   map[string]int64 // repo id + head sha → suite id
	dispatches    []Dispatch
	runs          []*WorkflowRun
	calls         []Call
	deliveries    []Delivery
	nextID        map[string]int64
	requestSeq    uint64
}

var defaultKey = sync.OnceValues(func() (*rsa.PrivateKey, error) {
	return rsa.GenerateKey(rand.Reader, 2048)
})

// New starts an emulator on a loopback port. It panics when opts are
// invalid (WebhookURL without WebhookSecret, a non-positive HookID…) or the
// default key cannot be generated, or it cannot listen.
func New(opts Options) *Server {
	s, err := newServer(opts)
	if err != nil {
		panic("githubtest: " + err.Error())
	}
	s.ts = loopback.Start(s.handler)
	return s
}

func newServer(opts Options) (*Server, error) {
	if opts.AppID == "" {
		opts.AppID = AppIDDefault
	}
	if opts.AppSlug == "" {
		opts.AppSlug = AppSlugDefault
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.ClockSkew == 0 {
		opts.ClockSkew = ClockSkewDefault
	}
	if opts.TokenTTL == 0 {
		opts.TokenTTL = TokenTTLDefault
	}
	if opts.RateLimit == 0 {
		opts.RateLimit = RateLimitDefault
	}
	if opts.RateLimitStatus == 0 {
		opts.RateLimitStatus = http.StatusForbidden
	}
	if opts.HTMLURL == "" {
		opts.HTMLURL = HTMLURLDefault
	}
	if opts.HookID == 0 {
		opts.HookID = 1
	}
	switch {
	case opts.RateLimit < 0:
		return nil, errors.New("Options.RateLimit must be positive")
	case opts.RateLimitStatus != http.StatusForbidden && opts.RateLimitStatus != http.StatusTooManyRequests:
		return nil, errors.New("Options.RateLimitStatus must be 403 or 429")
	case opts.TokenTTL < 0 || opts.ClockSkew < 0 || opts.Delay < 0:
		return nil, errors.New("Options.TokenTTL, ClockSkew and Delay must not be negative")
	case opts.HookID < 0:
		return nil, errors.New("Options.HookID must be positive")
	case opts.WebhookURL != "" && len(opts.WebhookSecret) == 0:
		return nil, errors.New("Options.WebhookSecret is required with Options.WebhookURL")
	}
	key := opts.AppKey
	if key == nil {
		var err error
		if key, err = defaultKey(); err != nil {
			return nil, fmt.Errorf("generating the app key: %w", err)
		}
	}
	s := &Server{
		opts:          opts,
		key:           key,
		delay:         opts.Delay,
		changed:       make(chan struct{}),
		installations: make(map[int64]*installation),
		repos:         make(map[string]*repository),
		reposByID:     make(map[int64]*repository),
		tokens:        make(map[string]*issuedToken),
		buckets:       make(map[string]*rateBucket),
		checkSuites:   make(map[string]int64),
		nextID:        make(map[string]int64),
	}
	s.hookClient = opts.WebhookClient
	if s.hookClient == nil {
		s.hookClient = &http.Client{Transport: &http.Transport{}, Timeout: WebhookTimeoutDefault}
		s.ownsClient = true
	}
	s.handler = s.routes()
	return s, nil
}

// URL is the emulator's API root, e.g. "http://127.0.0.1:41234"; use it as
// GITHUB_API_URL.
func (s *Server) URL() string { return s.ts.URL }

// Client returns an HTTP client for the emulator whose idle connections
// Close shuts down.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Handler returns the emulator's http.Handler, for mounting it elsewhere.
// URLs in response bodies are then built from the request's Host.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the listener, waits for in-flight requests and closes the
// webhook client's idle connections (when the Server owns that client).
func (s *Server) Close() {
	s.ts.Close()
	if s.ownsClient {
		s.hookClient.CloseIdleConnections()
	}
}

// AppID returns the app id the emulator expects as the JWT's iss.
func (s *Server) AppID() string { return s.opts.AppID }

// AppPrivateKey returns the app's private key, to sign app JWTs.
func (s *Server) AppPrivateKey() *rsa.PrivateKey { return s.key }

// AppPrivateKeyPEM returns the app's private key as GitHub hands it out: a
// PKCS #1 "RSA PRIVATE KEY" PEM block (GITHUB_APP_PRIVATE_KEY).
func (s *Server) AppPrivateKeyPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(s.key)})
}

// SetDelay sets the delay added before every call (see Options.Delay).
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

func (s *Server) now() time.Time { return s.opts.Clock() }

// idEpoch is where the clock part of emulator ids starts counting.
var idEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// globalIDs hands out the ids of check runs, check suites and workflow runs
// to every Server of the process (see Server.id).
var globalIDs struct {
	sync.Mutex
	next map[string]int64
}

// id returns the next id of a kind. GitHub's ids are unique forever, so the
// ids a database may hold from an earlier emulator (an earlier demo against
// the same database) must never come back: check runs, check suites and
// workflow runs take their ids from one counter per kind for the whole
// process, which starts at a distinct prefix for the kind (an id of one kind
// is never mistaken for another's) plus the milliseconds since 2026-01-01
// times 1,000 on the wall clock (not Options.Clock, which tests freeze). A
// later process starts past an earlier one's ids unless that one created
// more than 1,000 ids per millisecond between their starts. Workflow ids
// name workflow files and stay small and stable per Server, as on GitHub;
// dispatch sequence numbers count per Server from 1.
func (s *Server) id(kind string) int64 {
	if p, ok := map[string]int64{"check_run": 4, "check_suite": 5, "run": 9}[kind]; ok {
		globalIDs.Lock()
		defer globalIDs.Unlock()
		if globalIDs.next == nil {
			globalIDs.next = make(map[string]int64)
		}
		if globalIDs.next[kind] == 0 {
			globalIDs.next[kind] = p*1e16 + time.Since(idEpoch).Milliseconds()*1000 + 1
		}
		id := globalIDs.next[kind]
		globalIDs.next[kind]++
		return id
	}
	if s.nextID[kind] == 0 {
		s.nextID[kind] = map[string]int64{"workflow": 7_000_001}[kind]
		if s.nextID[kind] == 0 {
			s.nextID[kind] = 1
		}
	}
	id := s.nextID[kind]
	s.nextID[kind]++
	return id
}

// notify wakes Wait callers; s.mu must be held.
func (s *Server) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// installation and repository are the emulator's registry.
type installation struct {
	id          int64
	account     string
	suspended   bool
	permissions map[string]string
}

type repository struct {
	id             int64
	installationID int64
	owner, name    string
	defaultBranch  string
	refs           map[string]string // full ref → sha
	workflows      []*Workflow
	runNumbers     map[int64]int64 // workflow id → last run number
}

func (r *repository) fullName() string { return r.owner + "/" + r.name }

// DefaultPermissions are the permissions of an installation added with
// AddInstallation.
func DefaultPermissions() map[string]string {
	return map[string]string{"actions": "write", "checks": "write", "contents": "read", "metadata": "read"}
}

// AddInstallation registers an installation of the app on account (a user
// or organization login) with DefaultPermissions.
func (s *Server) AddInstallation(id int64, account string) error {
	if id <= 0 || account == "" {
		return errors.New("githubtest: AddInstallation needs a positive id and an account")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.installations[id]; ok {
		return fmt.Errorf("githubtest: installation %d already exists", id)
	}
	s.installations[id] = &installation{id: id, account: account, permissions: DefaultPermissions()}
	s.notify()
	return nil
}

// SuspendInstallation suspends (or unsuspends) an installation: GitHub then
// refuses to create its tokens (403) and rejects its existing ones (401).
func (s *Server) SuspendInstallation(id int64, suspended bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst, ok := s.installations[id]
	if !ok {
		return fmt.Errorf("githubtest: unknown installation %d", id)
	}
	inst.suspended = suspended
	s.notify()
	return nil
}

// AddRepository registers repository fullName ("owner/name") with id
// repoID in installation installationID, with a default branch "main" and,
// unless Options.NoReleaseWorkflow, the workflow ReleaseWorkflow().
func (s *Server) AddRepository(installationID, repoID int64, fullName string) error {
	owner, name, ok := strings.Cut(fullName, "/")
	if !ok || owner == "" || name == "" || strings.Contains(name, "/") || repoID <= 0 {
		return fmt.Errorf("githubtest: AddRepository needs a positive id and an owner/name, got %d %q", repoID, fullName)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.installations[installationID]; !ok {
		return fmt.Errorf("githubtest: unknown installation %d", installationID)
	}
	if _, ok := s.repos[strings.ToLower(fullName)]; ok {
		return fmt.Errorf("githubtest: repository %s already exists", fullName)
	}
	if _, ok := s.reposByID[repoID]; ok {
		return fmt.Errorf("githubtest: repository id %d already exists", repoID)
	}
	r := &repository{
		id: repoID, installationID: installationID, owner: owner, name: name, defaultBranch: "main",
		refs: make(map[string]string), runNumbers: make(map[int64]int64),
	}
	r.refs["refs/heads/main"] = syntheticSHA(fullName, "refs/heads/main")
	s.repos[strings.ToLower(fullName)] = r
	s.reposByID[repoID] = r
	if !s.opts.NoReleaseWorkflow {
		s.addWorkflowLocked(r, ReleaseWorkflow())
	}
	s.notify()
	return nil
}

// SetRef points ref ("refs/tags/v1.0.0", "refs/heads/main", or a short
// name taken as a tag when it is not an existing branch) of repoFullName at
// sha.
func (s *Server) SetRef(repoFullName, ref, sha string) error {
	if !isSHA(sha) {
		return fmt.Errorf("githubtest: %q is not a 40-hex commit SHA", sha)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.repos[strings.ToLower(repoFullName)]
	if !ok {
		return fmt.Errorf("githubtest: unknown repository %s", repoFullName)
	}
	r.refs[fullRef(r, ref)] = sha
	s.notify()
	return nil
}

func fullRef(r *repository, ref string) string {
	if strings.HasPrefix(ref, "refs/") {
		return ref
	}
	if strings.HasPrefix(ref, "heads/") || strings.HasPrefix(ref, "tags/") {
		return "refs/" + ref
	}
	if _, ok := r.refs["refs/heads/"+ref]; ok {
		return "refs/heads/" + ref
	}
	return "refs/tags/" + ref
}

// resolveRef returns the SHA ref points at: a SHA is itself; a full
// ("refs/tags/v1"), partial ("tags/v1", "heads/main") or short ("v1",
// "main") branch or tag name is looked up; an unknown ref gets a synthetic SHA
// unless Options.RequireKnownRefs. s.mu must be held.
func (s *Server) resolveRef(r *repository, ref string) (sha, full string, ok bool) {
	if isSHA(ref) {
		return strings.ToLower(ref), ref, true
	}
	candidates := []string{ref}
	if !strings.HasPrefix(ref, "refs/") {
		candidates = []string{"refs/heads/" + ref, "refs/tags/" + ref, "refs/" + ref}
	}
	for _, c := range candidates {
		if sha, ok := r.refs[c]; ok {
			return sha, c, true
		}
	}
	if s.opts.RequireKnownRefs {
		return "", "", false
	}
	full = fullRef(r, ref)
	return syntheticSHA(r.fullName(), full), full, true
}

func shortRef(ref string) string {
	for _, p := range []string{"refs/heads/", "refs/tags/"} {
		if rest, ok := strings.CutPrefix(ref, p); ok {
			return rest
		}
	}
	return ref
}

func isSHA(s string) bool {
	if len(s) != 40 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// timestamp formats t as GitHub does ("2006-01-02T15:04:05Z").
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
