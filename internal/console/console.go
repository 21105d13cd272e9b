package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// Prefix is the path every console route lives under.
const Prefix = "/console/"

// CookieName is the session cookie's name.
const CookieName = "pgoutbox_console"

// SessionTTLDefault is how long a session lasts after sign-in.
const SessionTTLDefault = 12 * time.Hour

// PageSizeDefault is the number of rows a list page shows; ?limit= may ask
// for up to PageSizeMax.
const (
	PageSizeDefault = 50
	PageSizeMax     = 500
)

// OperatorLabelMax bounds the operator label typed at sign-in (runes kept).
const OperatorLabelMax = 100

// Config configures the console.
type Config struct {
	// Pool is the database.
	Pool *pgxpool.Pool
	// OperatorToken (PGOUTBOX_OPERATOR_TOKEN) is what an operator types to
	// sign in. Empty: the console is read-only (every page open, every
	// action refused), as the operator routes are open without it.
	OperatorToken string
	// ControlPlane, when set, resolves and supersedes reconciliation
	// records (nil: those actions are unavailable and say so).
	ControlPlane *controlplane.App
	// GitHub says that ControlPlane has a GitHub client: resolve checks the
	// run there and the detail page lists the candidate runs. Without it a
	// resolve is refused unless forced, as `reconcile resolve`.
	GitHub bool
	// Logger receives sign-ins and actions (never a token or session id);
	// nil discards.
	Logger *slog.Logger
	// SessionTTL is a session's lifetime; 0 means SessionTTLDefault.
	SessionTTL time.Duration
	// Now is the clock of session expiry and of the sign-in limit; nil
	// means time.Now.
	Now func() time.Time
	// LiveRefresh is how often the queues overview and the effects list
	// refresh themselves in the browser; 0 means LiveRefreshDefault, a
	// negative value turns live refresh off.
	LiveRefresh time.Duration
	// SignInFailuresMax wrong tokens from one client IP within
	// SignInWindow make every further sign-in and bearer check from it
	// answer 429 until the window ends; 0 means SignInFailuresMaxDefault
	// and SignInWindowDefault. They configure the console's own limiter,
	// used when Limiter is nil.
	SignInFailuresMax int
	SignInWindow      time.Duration
	// Limiter, when set, counts the operator-token guesses of the sign-in
	// and of the pages' bearer checks instead (SignInFailuresMax and
	// SignInWindow are then unused). `serve` shares one with the server's
	// operator routes (internal/server), so that every route accepting
	// PGOUTBOX_OPERATOR_TOKEN draws on one budget per client address.
	Limiter *httpx.GuessLimiter
}

// LiveRefreshDefault is Config.LiveRefresh's default.
const LiveRefreshDefault = 5 * time.Second

// Sign-in limit defaults: 5 wrong tokens per client IP per 5 minutes.
const (
	SignInFailuresMaxDefault = httpx.GuessesMaxDefault
	SignInWindowDefault      = httpx.GuessWindowDefault
)

// Console serves the console's pages and actions.
type Console struct {
	cfg Config
	mux *http.ServeMux

	limit *httpx.GuessLimiter // operator-token comparisons by client IP

	mu       sync.Mutex
	sessions map[string]*session // by digest of the session id
}

// session is one signed-in operator.
type session struct {
	digest   string // hex SHA-256 of the cookie value; its first 12 characters are shown in the audit
	operator string
	csrf     string
	expires  time.Time
}

// New returns the console. Mount Handler on Prefix with the server's
// HandleOperatorSelfAuth (internal/server): the console enforces the
// operator token itself.
func New(cfg Config) (*Console, error) {
	if cfg.Pool == nil {
		return nil, errors.New("console: no database pool")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = SessionTTLDefault
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LiveRefresh == 0 {
		cfg.LiveRefresh = LiveRefreshDefault
	}
	if cfg.Limiter == nil {
		cfg.Limiter = httpx.NewGuessLimiter(cfg.SignInFailuresMax, cfg.SignInWindow, cfg.Now)
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux(), limit: cfg.Limiter, sessions: map[string]*session{}}
	c.routes()
	return c, nil
}

// Handler returns the console's handler (every route under Prefix).
func (c *Console) Handler() http.Handler { return c.mux }

// ReadOnly reports whether no operator token is configured.
func (c *Console) ReadOnly() bool { return c.cfg.OperatorToken == "" }

func (c *Console) routes() {
	read := func(p string, h http.HandlerFunc) { c.mux.Handle("GET "+p, c.requireRead(h)) }
	act := func(p string, h func(http.ResponseWriter, *http.Request, *session)) {
		c.mux.Handle("POST "+p, c.sameOrigin(c.requireAction(h)))
	}
	c.mux.HandleFunc("GET /console/signin", c.signinPage)
	c.mux.Handle("POST /console/signin", c.sameOrigin(http.HandlerFunc(c.signin)))
	c.mux.HandleFunc("GET /console/live.js", liveScript)
	c.mux.Handle("POST /console/signout", c.sameOrigin(c.requireAction(c.signout)))
	read("/console/{$}", c.overviewPage)
	read("/console/effects", c.effectsPage)
	read("/console/effects/{id}", c.effectPage)
	read("/console/dead-letters", c.deadLettersPage)
	read("/console/reconciliation", c.reconciliationPage)
	read("/console/audit", c.auditPage)
	read("/console/blocked-keys", c.blockedKeysPage)
	read("/console/workers", c.workersPage)
	act("/console/replay", c.replay)
	act("/console/cancel", c.cancel)
	act("/console/queues/pause", c.pauseQueue)
	act("/console/queues/resume", c.resumeQueue)
	act("/console/reconcile/{id}/resolve", c.resolve)
	act("/console/reconcile/{id}/supersede", c.supersede)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	return hex.EncodeToString(b)
}

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

// sessionOf returns the request's live session, or nil.
func (c *Console) sessionOf(r *http.Request) *session {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" || c.ReadOnly() {
		return nil
	}
	d := digest(ck.Value)
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[d]
	if s == nil {
		return nil
	}
	if !c.cfg.Now().Before(s.expires) {
		delete(c.sessions, d)
		return nil
	}
	return s
}

// requireRead lets a request read when the console is read-only, or it
// carries a live session or the operator token as a bearer header; a
// browser without either is sent to the sign-in page. A bearer token is
// compared under the sign-in limit: a wrong one answers 401, and once the
// client's budget is spent every bearer request (the right token
// included) answers 429 with Retry-After, uncompared.
func (c *Console) requireRead(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.ReadOnly() || c.sessionOf(r) != nil {
			h(w, r)
			return
		}
		present, ok, wait := httpx.CheckBearer(c.limit, r, c.cfg.OperatorToken)
		switch {
		case !present:
			http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
		case ok:
			h(w, r)
		case wait > 0:
			secs := httpx.RetryAfter(w, wait)
			c.cfg.Logger.Warn("console bearer token refused: too many wrong tokens", "remote", r.RemoteAddr, "retry_after_s", secs)
			httpx.Error(w, http.StatusTooManyRequests, "too many wrong operator tokens from your address; retry later")
		default:
			c.cfg.Logger.Warn("console bearer token refused: wrong operator token", "remote", r.RemoteAddr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="pgoutbox console"`)
			httpx.Error(w, http.StatusUnauthorized, "invalid bearer token (PGOUTBOX_OPERATOR_TOKEN)")
		}
	})
}

// requireAction refuses (403, nothing changed) a POST in read-only mode,
// without a live session, or without the session's CSRF token.
func (c *Console) requireAction(h func(http.ResponseWriter, *http.Request, *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.ReadOnly() {
			c.refuse(w, r, http.StatusForbidden, "The console is read-only: PGOUTBOX_OPERATOR_TOKEN is not set.")
			return
		}
		s := c.sessionOf(r)
		if s == nil {
			c.refuse(w, r, http.StatusForbidden, "Not signed in (or the session expired): sign in first.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			c.refuse(w, r, http.StatusBadRequest, "Unreadable form.")
			return
		}
		got := r.PostForm.Get("csrf")
		if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
			c.refuse(w, r, http.StatusForbidden, "Missing or invalid CSRF token: reload the page and try again.")
			return
		}
		h(w, r, s)
	})
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", "Sign in", nil)
}

// signin exchanges the operator token for a session cookie.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	if c.ReadOnly() {
		c.refuse(w, r, http.StatusForbidden, "The console is read-only: PGOUTBOX_OPERATOR_TOKEN is not set, so nobody can sign in.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		c.refuse(w, r, http.StatusBadRequest, "Unreadable form.")
		return
	}
	// Counted before it is compared, under the limiter's lock: concurrent
	// sign-ins cannot all pass one check.
	ok, wait := c.limit.Check(httpx.ClientIP(r), func() bool {
		return httpx.TokenMatches(r.PostForm.Get("token"), c.cfg.OperatorToken)
	})
	if wait > 0 {
		secs := httpx.RetryAfter(w, wait)
		c.cfg.Logger.Warn("console sign-in refused: too many wrong tokens", "remote", r.RemoteAddr, "retry_after_s", secs)
		c.render(w, r, http.StatusTooManyRequests, "signin", "Sign in",
			fmt.Sprintf("Too many wrong tokens from your address: try again in %d s.", secs))
		return
	}
	if !ok {
		c.cfg.Logger.Warn("console sign-in refused: wrong operator token", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusForbidden, "signin", "Sign in", "Wrong operator token.")
		return
	}
	label := strings.TrimSpace(r.PostForm.Get("operator"))
	if label == "" {
		label = "operator"
	}
	if rs := []rune(label); len(rs) > OperatorLabelMax {
		label = string(rs[:OperatorLabelMax])
	}
	id := randomHex(32)
	s := &session{digest: digest(id), operator: label, csrf: randomHex(32), expires: c.cfg.Now().Add(c.cfg.SessionTTL)}
	c.mu.Lock()
	now := c.cfg.Now()
	for d, old := range c.sessions { // expired sessions go at the next sign-in, if not looked up before
		if !now.Before(old.expires) {
			delete(c.sessions, d)
		}
	}
	c.sessions[s.digest] = s
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: id, Path: CookiePath, MaxAge: int(c.cfg.SessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	c.cfg.Logger.Info("console sign-in", "operator", label, "session", s.digest[:12])
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

func (c *Console) signout(w http.ResponseWriter, r *http.Request, s *session) {
	c.mu.Lock()
	delete(c.sessions, s.digest)
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: CookiePath, MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
}

// sameOrigin refuses (403, before anything is read or changed) a POST whose
// Origin header, or Referer when there is no Origin, names another host
// than the one the request was sent to. A request with neither header (a
// script, curl) passes on to the session and CSRF checks. The scheme is
// not compared: behind a proxy that terminates TLS the browser's origin is
// https while the request reaching pgoutbox is plain HTTP.
func (c *Console) sameOrigin(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from, header := r.Header.Get("Origin"), "Origin"
		if from == "" {
			from, header = r.Header.Get("Referer"), "Referer"
		}
		if from != "" {
			u, err := url.Parse(from)
			if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
				c.cfg.Logger.Warn("console POST refused: cross-origin", "path", r.URL.Path, "header", header,
					"from", short(from, 200), "remote", r.RemoteAddr)
				c.refuse(w, r, http.StatusForbidden, "Cross-origin request refused: the console accepts forms only from its own pages.")
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
