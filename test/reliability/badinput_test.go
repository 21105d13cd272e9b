package reliability

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

// badCase is one hostile or malformed request and the status it must get.
type badCase struct {
	name    string
	req     func() *http.Request
	want    int
	changes bool   // a positive control: it may change the counts
	header  string // a header the answer must carry ("Name: value")
}

// badInputCases are every malformed webhook and every unauthenticated
// operator call, against the running binary.
func badInputCases(s *stack) []badCase {
	secret := []byte(s.canaries["GITHUB_WEBHOOK_SECRET"])
	token := s.canaries["PGOUTBOX_API_TOKEN"]
	seq := 0
	hook := func(event, delivery string, body []byte, mutate func(*http.Request)) func() *http.Request {
		return func() *http.Request {
			seq++
			if delivery == "" {
				delivery = fmt.Sprintf("bad-%d-%d", time.Now().UnixNano(), seq)
			}
			req, _ := http.NewRequest(http.MethodPost, s.srv.url+"/webhooks/github", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(webhook.EventHeader, event)
			req.Header.Set(webhook.DeliveryHeader, delivery)
			req.Header.Set(webhook.SignatureHeader, webhook.Sign(secret, body))
			if mutate != nil {
				mutate(req)
			}
			return req
		}
	}
	ping := []byte(`{"zen":"Keep it logically awesome.","hook_id":1,"hook":{"app_id":1}}`)
	sha1sig := func(body []byte) string {
		m := hmac.New(sha1.New, secret)
		m.Write(body)
		return "sha1=" + hex.EncodeToString(m.Sum(nil))
	}
	api := func(method, path, ctype, body string, auth string) func() *http.Request {
		return func() *http.Request {
			req, _ := http.NewRequest(method, s.srv.url+path, strings.NewReader(body))
			if ctype != "" {
				req.Header.Set("Content-Type", ctype)
			}
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			return req
		}
	}
	bearer := "Bearer " + token
	return []badCase{
		// Webhooks (docs/controlplane.md, "Routes").
		{name: "webhook: valid ping (control)", req: hook("ping", "redelivered-1", ping, nil), want: http.StatusAccepted, changes: true},
		{name: "webhook: redelivery of the same id", req: hook("ping", "redelivered-1", ping, nil), want: http.StatusOK},
		{name: "webhook: wrong signature", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set(webhook.SignatureHeader, webhook.Sign([]byte("not-the-secret"), ping))
		}), want: http.StatusUnauthorized},
		{name: "webhook: signature of another body", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set(webhook.SignatureHeader, webhook.Sign(secret, []byte(`{}`)))
		}), want: http.StatusUnauthorized},
		{name: "webhook: no signature", req: hook("ping", "", ping, func(r *http.Request) { r.Header.Del(webhook.SignatureHeader) }), want: http.StatusUnauthorized},
		{name: "webhook: SHA-1 signature only (X-Hub-Signature)", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Del(webhook.SignatureHeader)
			r.Header.Set("X-Hub-Signature", sha1sig(ping))
		}), want: http.StatusUnauthorized},
		{name: "webhook: SHA-1 value in X-Hub-Signature-256", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set(webhook.SignatureHeader, sha1sig(ping))
		}), want: http.StatusUnauthorized},
		{name: "webhook: upper-case SHA256= prefix", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set(webhook.SignatureHeader, "SHA256="+strings.TrimPrefix(webhook.Sign(secret, ping), "sha256="))
		}), want: http.StatusUnauthorized},
		{name: "webhook: truncated signature", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set(webhook.SignatureHeader, webhook.Sign(secret, ping)[:40])
		}), want: http.StatusUnauthorized},
		{name: "webhook: malformed JSON (signed)", req: hook("push", "", []byte(`{"ref":`), nil), want: http.StatusBadRequest},
		{name: "webhook: JSON array (signed)", req: hook("push", "", []byte(`[1,2]`), nil), want: http.StatusBadRequest},
		{name: "webhook: wrong field type (signed)", req: hook("push", "", []byte(`{"ref":5}`), nil), want: http.StatusBadRequest},
		{name: "webhook: empty body (signed)", req: hook("ping", "", []byte{}, nil), want: http.StatusBadRequest},
		{name: "webhook: over WEBHOOK_MAX_BODY_BYTES (signed)", req: hook("ping", "", []byte(`{"zen":"`+strings.Repeat("z", 64<<10)+`"}`), nil), want: http.StatusRequestEntityTooLarge},
		{name: "webhook: Content-Type text/plain", req: hook("ping", "", ping, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") }), want: http.StatusUnsupportedMediaType},
		{name: "webhook: form-encoded", req: hook("ping", "", ping, func(r *http.Request) {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}), want: http.StatusUnsupportedMediaType},
		{name: "webhook: no Content-Type", req: hook("ping", "", ping, func(r *http.Request) { r.Header.Del("Content-Type") }), want: http.StatusUnsupportedMediaType},
		{name: "webhook: no X-GitHub-Event", req: hook("ping", "", ping, func(r *http.Request) { r.Header.Del(webhook.EventHeader) }), want: http.StatusBadRequest},
		{name: "webhook: no X-GitHub-Delivery", req: hook("ping", "", ping, func(r *http.Request) { r.Header.Del(webhook.DeliveryHeader) }), want: http.StatusBadRequest},
		{name: "webhook: 200-byte X-GitHub-Delivery", req: hook("ping", strings.Repeat("d", 200), ping, nil), want: http.StatusBadRequest},
		{name: "webhook: X-GitHub-Delivery not UTF-8 (signed)", req: hook("ping", "bad-\xff\xfe", ping, nil), want: http.StatusBadRequest},
		{name: "webhook: X-GitHub-Event not UTF-8 (signed)", req: hook("pi\xffng", "", ping, nil), want: http.StatusBadRequest},
		{name: "webhook: GET", req: api(http.MethodGet, "/webhooks/github", "", "", ""), want: http.StatusMethodNotAllowed},

		// Operator and application APIs without the right bearer.
		{name: "release-runs: no Authorization", req: api(http.MethodPost, "/api/release-runs", "application/json", `{}`, ""), want: http.StatusUnauthorized, header: "Www-Authenticate: Bearer"},
		{name: "release-runs: wrong bearer", req: api(http.MethodPost, "/api/release-runs", "application/json", `{}`, "Bearer wrong"), want: http.StatusUnauthorized},
		{name: "release-runs: token as Basic password", req: func() *http.Request {
			r := api(http.MethodPost, "/api/release-runs", "application/json", `{}`, "")()
			r.SetBasicAuth("x", token)
			return r
		}, want: http.StatusUnauthorized},
		{name: "release-runs: token prefix only", req: api(http.MethodPost, "/api/release-runs", "application/json", `{}`, "Bearer "+token[:len(token)-1]), want: http.StatusUnauthorized},
		{name: "records POST: no Authorization", req: api(http.MethodPost, "/api/records", "application/json", `{"id":"x"}`, ""), want: http.StatusUnauthorized},
		{name: "records POST: wrong bearer", req: api(http.MethodPost, "/api/records", "application/json", `{"id":"x"}`, "Bearer "+s.canaries["CRON_SECRET"]), want: http.StatusUnauthorized},
		{name: "records GET: no Authorization", req: api(http.MethodGet, "/api/records?q=x", "", "", ""), want: http.StatusUnauthorized},
		{name: "record GET by id: wrong bearer", req: api(http.MethodGet, "/api/records/x", "", "", "Bearer wrong"), want: http.StatusUnauthorized},
		{name: "import: wrong bearer", req: api(http.MethodPost, "/api/import", "application/x-ndjson", `{"id":"x"}`, "Bearer wrong"), want: http.StatusUnauthorized},
		{name: "cron: no Authorization", req: api(http.MethodGet, "/api/cron/outbox", "", "", ""), want: http.StatusUnauthorized, header: "Www-Authenticate: Bearer"},
		{name: "cron: wrong bearer", req: api(http.MethodGet, "/api/cron/outbox", "", "", "Bearer "+token), want: http.StatusUnauthorized, header: "Www-Authenticate: Bearer"},
		{name: "cron: secret in the query string", req: api(http.MethodGet, "/api/cron/outbox?secret="+s.canaries["CRON_SECRET"], "", "", ""), want: http.StatusUnauthorized},

		// Malformed records with the right bearer.
		{name: "records POST: malformed JSON", req: api(http.MethodPost, "/api/records", "application/json", `{"id":`, bearer), want: http.StatusBadRequest},
		{name: "records POST: no id", req: api(http.MethodPost, "/api/records", "application/json", `{"title":"x"}`, bearer), want: http.StatusBadRequest},
		{name: "records POST: over PROJECTION_MAX_RECORD_BYTES", req: api(http.MethodPost, "/api/records", "application/json", `{"id":"big","t":"`+strings.Repeat("x", 9<<10)+`"}`, bearer), want: http.StatusRequestEntityTooLarge},
		{name: "records POST: text/plain", req: api(http.MethodPost, "/api/records", "text/plain", `{"id":"x"}`, bearer), want: http.StatusUnsupportedMediaType},
		{name: "records POST: NUL in a value", req: api(http.MethodPost, "/api/records", "application/json", `{"id":"n","t":"a\u0000b"}`, bearer), want: http.StatusBadRequest},
		{name: "import: unknown content type", req: api(http.MethodPost, "/api/import", "application/xml", `<x/>`, bearer), want: http.StatusUnsupportedMediaType},
		{name: "import: JSON that is not an array", req: api(http.MethodPost, "/api/import", "application/json", `{"id":"x"}`, bearer), want: http.StatusBadRequest},
	}
}

// Scenario 9: every malformed webhook and every call to an operator or
// cron endpoint without the right bearer, against the real binary: the
// table of status codes, and nothing written by any refused request.
func TestBadInputAgainstBinary(t *testing.T) {
	long(t)
	ctx := timeout(t, 4*time.Minute)
	bin := buildBinary(t, t.TempDir())
	s := newStack(t, ctx, bin)
	var table []map[string]any
	for _, c := range badInputCases(s) {
		before := s.counts(t)
		status, hdr, body := s.do(t, c.req())
		after := s.counts(t)
		row := map[string]any{"case": c.name, "want": c.want, "got": status, "unchanged": before == after}
		table = append(table, row)
		if status != c.want {
			t.Errorf("%s: status %d, want %d (answer %q)", c.name, status, c.want, strings.TrimSpace(body))
		}
		if !c.changes && before != after {
			t.Errorf("%s: a refused request changed the database: %s → %s", c.name, before, after)
		}
		if c.header != "" {
			k, v, _ := strings.Cut(c.header, ": ")
			if !strings.HasPrefix(hdr.Get(k), v) {
				t.Errorf("%s: header %s is %q, want %q", c.name, k, hdr.Get(k), v)
			}
		}
	}
	s.srv.stop(t, ctx)
	report(t, "9 bad input and unauthenticated calls (binary)", figures{"cases": len(table), "table": table})
}
