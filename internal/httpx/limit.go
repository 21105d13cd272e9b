package httpx

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Guess limit defaults: 5 wrong secrets per client address per 5 minutes.
const (
	GuessesMaxDefault  = 5
	GuessWindowDefault = 5 * time.Minute
)

// guessClientsMax bounds a GuessLimiter's table: past it, the entries
// whose window ended are dropped, and when none has, the oldest goes.
const guessClientsMax = 10000

// GuessLimiter limits the secrets (operator tokens) one client address may
// have compared: each attempt is counted before its comparison, under the
// limiter's lock, so concurrent attempts cannot all pass one check. A
// right secret gives its count back but forgives nothing: wrong ones stay
// counted until their window ends, so a client that shares the operator's
// address (behind a proxy) does not get a fresh budget each time the
// operator signs in. One limiter may guard several routes (the console's
// sign-in, its bearer checks and the server's operator routes): they then
// share each client's budget. It is safe for concurrent use.
type GuessLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	clients map[string]*guesses
}

// guesses counts one client's attempts in a window that starts at the
// first of them.
type guesses struct {
	n     int
	start time.Time
}

// NewGuessLimiter returns a limiter that compares at most max attempts per
// client within window, counted from the client's first attempt. max ≤ 0
// means GuessesMaxDefault, window ≤ 0 GuessWindowDefault, a nil now
// time.Now.
func NewGuessLimiter(max int, window time.Duration, now func() time.Time) *GuessLimiter {
	if max <= 0 {
		max = GuessesMaxDefault
	}
	if window <= 0 {
		window = GuessWindowDefault
	}
	if now == nil {
		now = time.Now
	}
	return &GuessLimiter{max: max, window: window, now: now, clients: map[string]*guesses{}}
}

// Check counts an attempt by client and, unless the client's budget is
// spent, calls matches (the comparison) and reports its answer. When the
// budget is spent matches is not called: ok is false and wait is how long
// the client must wait (> 0).
func (l *GuessLimiter) Check(client string, matches func() bool) (ok bool, wait time.Duration) {
	now := l.now()
	l.mu.Lock()
	g := l.clients[client]
	if g != nil && !now.Before(g.start.Add(l.window)) {
		delete(l.clients, client)
		g = nil
	}
	if g == nil {
		if len(l.clients) >= guessClientsMax {
			l.prune(now)
		}
		g = &guesses{start: now}
		l.clients[client] = g
	}
	if g.n >= l.max {
		wait = g.start.Add(l.window).Sub(now)
		l.mu.Unlock()
		return false, wait
	}
	g.n++
	l.mu.Unlock()
	if !matches() {
		return false, 0
	}
	l.mu.Lock()
	g.n-- // a right secret is not a guess (g may have left the table: harmless)
	l.mu.Unlock()
	return true, 0
}

// prune drops the entries whose window ended; if none had, the oldest
// goes. l.mu is held.
func (l *GuessLimiter) prune(now time.Time) {
	oldest, at := "", now
	for c, g := range l.clients {
		if !now.Before(g.start.Add(l.window)) {
			delete(l.clients, c)
		} else if !g.start.After(at) {
			oldest, at = c, g.start
		}
	}
	if len(l.clients) >= guessClientsMax {
		delete(l.clients, oldest)
	}
}

// RetryAfter sets the Retry-After header to wait, rounded up to whole
// seconds (at least 1), and returns that number.
func RetryAfter(w http.ResponseWriter, wait time.Duration) int64 {
	secs := max(int64(math.Ceil(wait.Seconds())), 1)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return secs
}

// ClientIP is the request's peer address without the port. Forwarded
// headers are not trusted: behind a reverse proxy every client shares the
// proxy's address, and so its limits.
func ClientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// CheckBearer compares r's "Authorization: Bearer" token with token under
// lim (the comparison counted first, as [GuessLimiter.Check]). present is
// false when r carries no bearer token: nothing is compared or counted.
// Otherwise ok reports a match, and wait > 0 says that the client's
// budget is spent and nothing was compared.
func CheckBearer(lim *GuessLimiter, r *http.Request, token string) (present, ok bool, wait time.Duration) {
	got, present := BearerToken(r)
	if !present {
		return false, false, 0
	}
	ok, wait = lim.Check(ClientIP(r), func() bool { return TokenMatches(got, token) })
	return true, ok, wait
}
