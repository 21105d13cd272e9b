package httpout

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

var now = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0030", 30 * time.Second, true},
		{"99999999999999999999", time.Duration(math.MaxInt64), true}, // too long for a Duration: the longest
		{"9223372037", time.Duration(math.MaxInt64), true},
		{"-5", 0, false},
		{"+5", 0, false},
		{"1.5", 0, false},
		{"5s", 0, false},
		{"soon", 0, false},
		{"Tue, 01 Dec 2026 09:00:30 GMT", 30 * time.Second, true},  // IMF-fixdate
		{"Tuesday, 01-Dec-26 09:02:00 GMT", 2 * time.Minute, true}, // RFC 850
		{"Tue Dec  1 09:00:05 2026", 5 * time.Second, true},        // asctime
		{"Tue, 01 Dec 2026 08:59:00 GMT", 0, true},                 // passed: retry now
		{"Tue, 01 Dec 2026 09:00:00 GMT", 0, true},                 // now
		{"Tue, 01 Dec 2026 25:00:00 GMT", 0, false},                // not a date
		{"2026-12-01T09:00:30Z", 0, false},                         // RFC 3339 is not an HTTP-date
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set("Retry-After", tc.value)
		}
		d, ok := RetryAfter(h, now)
		if d != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q: %s %v, want %s %v", tc.value, d, ok, tc.want, tc.ok)
		}
	}
}

func TestServerNow(t *testing.T) {
	t.Parallel()
	local := now.Add(time.Hour)
	h := http.Header{"Date": {"Tue, 01 Dec 2026 09:00:00 GMT"}}
	if got := ServerNow(h, local); !got.Equal(now) {
		t.Errorf("with Date: %s, want %s", got, now)
	}
	for _, d := range []string{"", "yesterday"} {
		if got := ServerNow(http.Header{"Date": {d}}, local); !got.Equal(local) {
			t.Errorf("Date %q: %s, want the local %s", d, got, local)
		}
	}
}

func TestOutcome(t *testing.T) {
	t.Parallel()
	date := "Tue, 01 Dec 2026 09:00:00 GMT"
	for _, tc := range []struct {
		status     int
		retryAfter string
		want       pgoutbox.Outcome
		after      time.Duration
	}{
		{429, "7", pgoutbox.OutcomeRetryAfter, 7 * time.Second},
		{503, "Tue, 01 Dec 2026 09:01:30 GMT", pgoutbox.OutcomeRetryAfter, 90 * time.Second},
		{429, "Tue, 01 Dec 2026 09:00:45 GMT", pgoutbox.OutcomeRetryAfter, 45 * time.Second},
		{429, "", pgoutbox.OutcomeRetry, 0},
		{503, "later", pgoutbox.OutcomeRetry, 0},
		{500, "7", pgoutbox.OutcomeRetry, 0}, // only 429 and 503 are honoured
		{502, "", pgoutbox.OutcomeRetry, 0},
		{408, "", pgoutbox.OutcomeRetry, 0},
		{400, "", pgoutbox.OutcomePermanent, 0},
		{401, "", pgoutbox.OutcomePermanent, 0},
		{404, "", pgoutbox.OutcomePermanent, 0},
		{409, "", pgoutbox.OutcomePermanent, 0},
		{301, "", pgoutbox.OutcomePermanent, 0},
	} {
		h := http.Header{"Date": {date}}
		if tc.retryAfter != "" {
			h.Set("Retry-After", tc.retryAfter)
		}
		cause := errors.New("HTTP status")
		err := Outcome(&http.Response{StatusCode: tc.status, Header: h}, cause)
		var oe *pgoutbox.OutcomeError
		if !errors.As(err, &oe) || oe.Outcome != tc.want || oe.After != tc.after || !errors.Is(err, cause) {
			t.Errorf("HTTP %d Retry-After %q: %v (%+v), want %s after %s", tc.status, tc.retryAfter, err, oe, tc.want, tc.after)
		}
	}
}

func TestErrorBodyAndExcerpt(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", MaxErrorBody+100)
	body := strings.NewReader(long)
	if b := ErrorBody(&http.Response{Body: io.NopCloser(body)}); len(b) != MaxErrorBody || body.Len() != 100 {
		t.Errorf("read %d bytes, %d left; want %d read, 100 left", len(b), body.Len(), MaxErrorBody)
	}
	if got := Excerpt("short", 10); got != "short" {
		t.Errorf("short: %q", got)
	}
	if got := Excerpt("abcdéf", 5); got != "abcd…" { // é is two bytes: never half a character
		t.Errorf("cut: %q", got)
	}
}

func TestTransportError(t *testing.T) {
	t.Parallel()
	req, _ := http.NewRequest(http.MethodPost, "http://user:pw@127.0.0.1:1/solr/c/update?secret=q", nil)
	_, err := http.DefaultClient.Do(req)
	got := TransportError("solr", req, err)
	var oe *pgoutbox.OutcomeError
	if !errors.As(got, &oe) || oe.Outcome != pgoutbox.OutcomeAmbiguous ||
		!strings.HasPrefix(got.Error(), "solr: POST /solr/c/update: ") || strings.Contains(got.Error(), "secret=q") || strings.Contains(got.Error(), "pw") {
		t.Errorf("refused: %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req = req.WithContext(ctx)
	_, err = http.DefaultClient.Do(req)
	if got := TransportError("solr", req, err); !errors.Is(got, context.Canceled) {
		t.Errorf("canceled: %v", got)
	}
}

func TestURLProblem(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"http://solr:8983/solr":   "",
		"https://g.example/x?a=1": "",
		"ftp://g/x":               "is not an http(s) URL",
		"/solr":                   "is not an http(s) URL",
		"http:///solr":            "is not an http(s) URL",
		"http://%zz":              "is not an http(s) URL",
		"http://u:p@g/x":          "must not carry credentials: set Config.Username and Config.Password",
		"https://u@g/x":           "must not carry credentials: set Config.Username and Config.Password",
	} {
		if got := URLProblem(raw); got != want {
			t.Errorf("%q: %q, want %q", raw, got, want)
		}
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	mine := &http.Client{}
	if Client(mine, time.Second) != mine {
		t.Error("a given client was replaced")
	}
	if c := Client(nil, 7*time.Second); c == nil || c.Timeout != 7*time.Second {
		t.Errorf("default client: %+v", c)
	}
}
