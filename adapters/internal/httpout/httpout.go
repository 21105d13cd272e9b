// Package httpout is the HTTP plumbing the targets share: reading an answer
// that is not a success (Retry-After, a bounded error body) and mapping its
// status to a pgoutbox outcome. It imports only the root package, so any
// target may use it; applications never do.
package httpout

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// MaxErrorBody bounds how much of an answer that is not a success is read
// (4 KiB): enough for a server's error message, not a whole HTML page.
const MaxErrorBody = 4 << 10

// maxDelaySeconds is the largest delay-seconds that fits a time.Duration.
const maxDelaySeconds = math.MaxInt64 / int64(time.Second)

// RetryAfter reads a Retry-After header (RFC 9110, section 10.2.3): either
// delay-seconds (one or more ASCII digits) or an HTTP-date in any of the
// three formats a recipient must accept (IMF-fixdate, RFC 850, asctime),
// measured from now. ok is false when the header is absent, empty, negative
// ("-5"), signed ("+5"), fractional or otherwise not one of the two forms. A
// date at or before now is 0 (retry now). A delay too long for a
// time.Duration is the longest one; bounding it is the engine's business
// (pgoutbox.RetryAfterCap).
func RetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if allDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > maxDelaySeconds { // only digits: too large
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(n) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// URLProblem says what makes raw unusable as a target's endpoint, as the
// end of a sentence naming the setting ("" when usable): "is not an
// http(s) URL" unless it is an absolute http or https URL with a host, or
// "must not carry credentials: set Config.Username and Config.Password"
// when it holds a userinfo (credentials belong in those fields, which error
// texts never show).
func URLProblem(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "is not an http(s) URL"
	}
	if u.User != nil {
		return "must not carry credentials: set Config.Username and Config.Password"
	}
	return ""
}

// Client is hc, or when hc is nil a new client whose requests time out
// after timeout.
func Client(hc *http.Client, timeout time.Duration) *http.Client {
	if hc == nil {
		return &http.Client{Timeout: timeout}
	}
	return hc
}

// ServerNow is the server's clock at the answer, from its Date header, or
// local when the header is absent or malformed. An HTTP-date in Retry-After
// or a rate-limit reset measured from it does not depend on this host's
// clock.
func ServerNow(h http.Header, local time.Time) time.Time {
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		return d
	}
	return local
}

// Outcome maps a status that is not a success to a pgoutbox outcome,
// wrapping err: 429 and 503 retry no earlier than their Retry-After (plain
// retry without a usable one), any other 5xx and 408 retry, and every other
// status is permanent. The Retry-After date is measured from the answer's
// Date (ServerNow).
func Outcome(resp *http.Response, err error) error {
	switch code := resp.StatusCode; {
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		if d, ok := RetryAfter(resp.Header, ServerNow(resp.Header, time.Now())); ok {
			return pgoutbox.RetryAfter(d, err)
		}
		return pgoutbox.Retry(err)
	case code >= 500 || code == http.StatusRequestTimeout:
		return pgoutbox.Retry(err)
	default:
		return pgoutbox.Permanent(err)
	}
}

// ErrorBody reads at most MaxErrorBody bytes of an error answer's body
// (what it cannot read is left unread; the caller closes the body).
func ErrorBody(resp *http.Response) []byte {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBody))
	return b
}

// Excerpt bounds a server's message to n bytes for an error text: cut on a
// character boundary and marked with "…" when cut.
func Excerpt(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// TransportError is the outcome of a request that got no answer: ambiguous
// (the server may have applied it). The text names the method and path but
// not the query or credentials of the URL, and says "context canceled" or
// "deadline exceeded" when the request's context ended.
func TransportError(target string, req *http.Request, err error) error {
	return pgoutbox.Ambiguous(TransportCause(target, req, err))
}

// TransportCause is TransportError's error before it is classified, for a
// target that decides the outcome itself (a request that never left is a
// plain retry).
func TransportCause(target string, req *http.Request, err error) error {
	if ctxErr := req.Context().Err(); ctxErr != nil {
		err = ctxErr
	} else if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err
	}
	return fmt.Errorf("%s: %s %s: %w", target, req.Method, req.URL.Path, err)
}
