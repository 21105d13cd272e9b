package httpdelivery

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/internal/httpout"
)

// Defaults of an Endpoint.
const (
	// ConcurrencyDefault is Endpoint.Concurrency's default: at most 8
	// requests in flight to one endpoint.
	ConcurrencyDefault = 8
	// TimeoutDefault is Endpoint.Timeout's default: 10 s for one request,
	// answer included.
	TimeoutDefault = 10 * time.Second
	// MaxAnswerBytes bounds how much of an answer is read (64 KiB); the rest
	// is left unread and the connection closed.
	MaxAnswerBytes = 64 << 10
	// ErrorExcerptBytes bounds how much of an error answer an error text
	// quotes (512 bytes).
	ErrorExcerptBytes = 512
	// SecretPrefix starts a Standard Webhooks secret: "whsec_" and the
	// base64 of the key.
	SecretPrefix = "whsec_"
	// MinSecretBytes and MaxSecretBytes bound the decoded key, as the
	// specification recommends (24 to 64 bytes).
	MinSecretBytes, MaxSecretBytes = 24, 64
)

// Endpoint is one destination of HTTP deliveries.
type Endpoint struct {
	// Name names the endpoint in logs and errors (its URL never appears
	// there with its query).
	Name string
	// URL is the absolute http(s) URL every request is POSTed to; it must
	// not carry credentials.
	URL string
	// Secret is the Standard Webhooks signing secret: "whsec_" and the
	// base64 of 24 to 64 bytes (ParseSecret).
	Secret string
	// Concurrency bounds the requests in flight to this endpoint across
	// every queue that delivers to it; default ConcurrencyDefault.
	Concurrency int
	// Timeout bounds one request, answer included; default TimeoutDefault.
	// The delivery's own timeout (the queue's DeliveryTimeout) may end it
	// sooner.
	Timeout time.Duration
}

// Deliverer posts effects to one Endpoint. It is safe for concurrent use.
type Deliverer struct {
	ep     Endpoint
	key    []byte
	hc     *http.Client
	slots  chan struct{}
	inUse  atomic.Int64
	maxUse atomic.Int64
}

// ParseSecret decodes a Standard Webhooks secret ("whsec_" and standard
// base64) into its HMAC key, refusing one outside 24 to 64 bytes. The error
// never quotes the secret.
func ParseSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	rest, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return nil, errors.New("httpdelivery: the secret must start with " + SecretPrefix + " (Standard Webhooks)")
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return nil, errors.New("httpdelivery: the secret after " + SecretPrefix + " is not standard base64")
	}
	if len(key) < MinSecretBytes || len(key) > MaxSecretBytes {
		return nil, fmt.Errorf("httpdelivery: the secret decodes to %d bytes, want %d to %d", len(key), MinSecretBytes, MaxSecretBytes)
	}
	return key, nil
}

// New checks ep and returns its Deliverer. hc, when set, sends the requests
// (its redirect policy is replaced: redirects are never followed); nil: a
// client of its own.
func New(ep Endpoint, hc *http.Client) (*Deliverer, error) {
	if ep.Name == "" {
		return nil, errors.New("httpdelivery: an endpoint needs a name")
	}
	if p := httpout.URLProblem(ep.URL); p != "" {
		if strings.HasPrefix(p, "must not carry credentials") {
			p = "must not carry credentials"
		}
		return nil, fmt.Errorf("httpdelivery: endpoint %s: the URL %s", ep.Name, p)
	}
	key, err := ParseSecret(ep.Secret)
	if err != nil {
		return nil, fmt.Errorf("endpoint %s: %w", ep.Name, err)
	}
	if ep.Concurrency < 0 || ep.Timeout < 0 {
		return nil, fmt.Errorf("httpdelivery: endpoint %s: concurrency and timeout must not be negative", ep.Name)
	}
	if ep.Concurrency == 0 {
		ep.Concurrency = ConcurrencyDefault
	}
	if ep.Timeout == 0 {
		ep.Timeout = TimeoutDefault
	}
	c := http.Client{}
	if hc != nil {
		c = *hc
	}
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Deliverer{ep: ep, key: key, hc: &c, slots: make(chan struct{}, ep.Concurrency)}, nil
}

// Endpoint is the endpoint, with its defaults filled in.
func (d *Deliverer) Endpoint() Endpoint { return d.ep }

// MaxInFlight is the most requests this Deliverer had in flight at once.
func (d *Deliverer) MaxInFlight() int64 { return d.maxUse.Load() }

// Handler is the pgoutbox.Handler that delivers an effect to the endpoint.
func (d *Deliverer) Handler() pgoutbox.Handler { return d.Deliver }

// envelope is the request body.
type envelope struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// Sign is the webhook-signature value of a request with id, timestamp ts
// and body under key: "v1," and the base64 HMAC-SHA256 of id.ts.body.
func Sign(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write([]byte(strconv.FormatInt(ts, 10)))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Deliver posts one effect and maps the answer to its outcome (package
// doc, "Outcomes").
func (d *Deliverer) Deliver(ctx context.Context, dl *pgoutbox.Delivery) error {
	data := dl.Payload
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	body, err := json.Marshal(envelope{Type: dl.Type, Timestamp: dl.CreatedAt.UTC(), Data: data})
	if err != nil {
		return pgoutbox.Permanent(fmt.Errorf("httpdelivery: %s: encode the body: %w", d.ep.Name, err))
	}
	select {
	case d.slots <- struct{}{}:
	case <-ctx.Done():
		// Nothing was sent: waiting for a free slot is not an attempt.
		return pgoutbox.Retry(fmt.Errorf("httpdelivery: %s: no free request slot (concurrency %d) before %w",
			d.ep.Name, d.ep.Concurrency, ctx.Err()))
	}
	n := d.inUse.Add(1)
	for m := d.maxUse.Load(); n > m && !d.maxUse.CompareAndSwap(m, n); m = d.maxUse.Load() {
	}
	defer func() { d.inUse.Add(-1); <-d.slots }()

	ctx, cancel := context.WithTimeout(ctx, d.ep.Timeout)
	defer cancel()
	var sent atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(i httptrace.WroteRequestInfo) { sent.Store(i.Err == nil) },
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.ep.URL, bytes.NewReader(body))
	if err != nil {
		return pgoutbox.Permanent(fmt.Errorf("httpdelivery: %s: %w", d.ep.Name, err))
	}
	ts := time.Now().Unix()
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "pgoutbox")
	h.Set("webhook-id", dl.Key)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	h.Set("webhook-signature", Sign(d.key, dl.Key, ts, body))
	h.Set("pgoutbox-queue", dl.Queue)
	h.Set("pgoutbox-effect-type", dl.Type)
	h.Set("pgoutbox-effect-id", strconv.FormatInt(dl.ID, 10))
	h.Set("pgoutbox-attempt", strconv.Itoa(dl.Attempt))
	// The delivery's span (the Client's consumer span) continues in the
	// endpoint: traceparent (and tracestate), as W3C Trace Context says,
	// whatever propagator the application installed globally.
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	resp, err := d.hc.Do(req)
	if err != nil {
		// The text names the endpoint, the method and the URL's path, never
		// its query.
		cause := httpout.TransportCause("httpdelivery: "+d.ep.Name, req, err)
		if !sent.Load() {
			// The request never left whole: the endpoint cannot have acted.
			return pgoutbox.Retry(cause)
		}
		return pgoutbox.Ambiguous(cause)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, MaxAnswerBytes))
		return nil
	}
	msg := httpout.Excerpt(strings.TrimSpace(string(httpout.ErrorBody(resp))), ErrorExcerptBytes)
	return httpout.Outcome(resp, fmt.Errorf("httpdelivery: %s: answered %d: %s", d.ep.Name, resp.StatusCode, msg))
}
