package webhook_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

// seedCorpus adds GitHub's published payloads (up to limit bytes each) as
// (event, body) seeds.
func seedCorpus(f *testing.F, limit int, add func(p fakegh.Payload)) {
	payloads, err := fakegh.Payloads()
	if err != nil {
		f.Fatal(err)
	}
	for _, p := range payloads {
		if len(p.Body) <= limit {
			add(p)
		}
	}
}

// FuzzVerify checks X-Hub-Signature-256 verification: it accepts exactly
// the "sha256=" HMAC of the body under the secret (hex in either case),
// refuses an empty secret, every other scheme (sha1=) and any tampered
// body, and returns only its sentinel errors.
func FuzzVerify(f *testing.F) {
	f.Add([]byte("secret"), []byte(`{"zen":"hi"}`), "")
	f.Add([]byte("secret"), []byte(`{}`), "sha1=0123456789abcdef0123456789abcdef01234567")
	f.Add([]byte(""), []byte(`{}`), "sha256=00")
	f.Add([]byte("k"), []byte{}, "sha256=")
	f.Add([]byte("k"), []byte("x"), "SHA256=ab")
	f.Add([]byte("\x00"), []byte("\xff"), "sha256= "+strings.Repeat("a", 63))
	f.Fuzz(func(t *testing.T, secret, body []byte, header string) {
		err := webhook.Verify(secret, body, header)
		switch {
		case err == nil, errors.Is(err, webhook.ErrEmptySecret), errors.Is(err, webhook.ErrMissingSignature),
			errors.Is(err, webhook.ErrBadSignature):
		default:
			t.Fatalf("Verify returned an unexpected error %v", err)
		}
		if len(secret) == 0 {
			if !errors.Is(err, webhook.ErrEmptySecret) {
				t.Fatalf("empty secret: %v, want ErrEmptySecret", err)
			}
			return
		}
		good := webhook.Sign(secret, body)
		if err == nil {
			hexSig, ok := strings.CutPrefix(header, webhook.SignaturePrefix)
			if !ok || !strings.EqualFold(hexSig, strings.TrimPrefix(good, webhook.SignaturePrefix)) {
				t.Fatalf("Verify accepted %q; the signature is %q", header, good)
			}
		}
		if strings.HasPrefix(header, "sha1=") && err == nil {
			t.Fatalf("Verify accepted a SHA-1 signature %q", header)
		}
		if err := webhook.Verify(secret, body, good); err != nil {
			t.Fatalf("Verify refused its own signature: %v", err)
		}
		if err := webhook.Verify(secret, body, webhook.SignaturePrefix+strings.ToUpper(good[len(webhook.SignaturePrefix):])); err != nil {
			t.Fatalf("Verify refused the upper-case hex of its signature: %v", err)
		}
		tampered := append(bytes.Clone(body), 0)
		if len(body) > 0 {
			tampered = bytes.Clone(body)
			tampered[len(tampered)/2] ^= 0x01
		}
		if err := webhook.Verify(secret, tampered, good); !errors.Is(err, webhook.ErrBadSignature) {
			t.Fatalf("Verify of a tampered body: %v, want ErrBadSignature", err)
		}
		if err != nil && len(secret) >= 4 && strings.Contains(err.Error(), string(secret)) {
			t.Fatalf("error %q quotes the secret", err)
		}
	})
}

// handledEvents are the events with a section of their own.
var handledEvents = map[string]bool{
	webhook.EventInstallation: true, webhook.EventInstallationRepositories: true, webhook.EventPush: true,
	webhook.EventRelease: true, webhook.EventCheckRun: true, webhook.EventCheckSuite: true,
	webhook.EventWorkflowRun: true, webhook.EventPing: true,
}

// FuzzNormalize checks the normalized record's bounds on arbitrary bodies
// and event names: failures wrap ErrMalformed and never quote payload
// strings; a success encodes below MaxEncodedBytes, holds only valid UTF-8
// strings of at most MaxStringBytes (encoded), sets exactly one section for
// a handled event and none (Ignored) otherwise, and is deterministic.
func FuzzNormalize(f *testing.F) {
	seedCorpus(f, 64<<10, func(p fakegh.Payload) { f.Add(p.Event, p.Body) })
	f.Add("push", []byte(`{"ref":"refs/tags/v1","after":"`+strings.Repeat("é", 900)+`"}`))
	f.Add("installation", []byte(`{"action":"created","repositories":[{"id":1,"full_name":"a/b"}]}`))
	f.Add("workflow_run", []byte(`{"workflow_run":{"id":"not a number"}}`))
	f.Add("", []byte(`{}`))
	f.Add("ping", []byte(`[]`))
	f.Add("check_run", []byte(`{"check_run":{"name":"\ud800"}}`))
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		n, err := webhook.Normalize(event, body)
		if err != nil {
			if !errors.Is(err, webhook.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			msg := err.Error()
			if len(msg) > 4*webhook.MaxStringBytes {
				t.Fatalf("error of %d bytes", len(msg))
			}
			for _, s := range payloadStrings(body) {
				if len(s) >= 12 && !vocabulary(s) && strings.Contains(msg, s) {
					t.Fatalf("error %q quotes payload content %q", msg, s)
				}
			}
			return
		}
		enc, merr := json.Marshal(n)
		if merr != nil {
			t.Fatalf("marshal: %v", merr)
		}
		if len(enc) >= webhook.MaxEncodedBytes {
			t.Fatalf("normalized record encodes to %d bytes, limit %d", len(enc), webhook.MaxEncodedBytes)
		}
		var generic any
		if err := json.Unmarshal(enc, &generic); err != nil {
			t.Fatal(err)
		}
		checkStrings(t, generic)
		if err := checkStringsRaw(enc); err != nil {
			t.Fatal(err)
		}
		sections := 0
		v := reflect.ValueOf(n)
		for i := range v.NumField() {
			if fv := v.Field(i); fv.Kind() == reflect.Pointer && !fv.IsNil() {
				sections++
			}
		}
		if handledEvents[event] != (sections == 1) || n.Ignored == handledEvents[event] || sections > 1 {
			t.Fatalf("event %q: %d sections, ignored %v", event, sections, n.Ignored)
		}
		again, err := webhook.Normalize(event, body)
		if err != nil || !reflect.DeepEqual(n, again) {
			t.Fatalf("Normalize is not deterministic: %v", err)
		}
	})
}

// vocabulary reports whether s could be a field path or type name of the
// record (which error messages may name).
func vocabulary(s string) bool {
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789_.()[]* ") == ""
}

// payloadStrings returns the string values of body, if it is JSON.
func payloadStrings(body []byte) []string {
	var v any
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// checkStrings fails on a string that is not valid UTF-8.
func checkStrings(t *testing.T, v any) {
	t.Helper()
	switch x := v.(type) {
	case string:
		if !utf8.ValidString(x) {
			t.Fatalf("invalid UTF-8 string %q in a normalized record", x)
		}
	case map[string]any:
		for _, e := range x {
			checkStrings(t, e)
		}
	case []any:
		for _, e := range x {
			checkStrings(t, e)
		}
	}
}

// checkStringsRaw fails on a JSON string token whose encoding (without
// quotes) is longer than MaxStringBytes.
func checkStringsRaw(enc []byte) error {
	dec := json.NewDecoder(bytes.NewReader(enc))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		if s, ok := tok.(string); ok {
			b, _ := json.Marshal(s)
			if len(b)-2 > webhook.MaxStringBytes {
				return errors.New("a string of the normalized record encodes to more than MaxStringBytes")
			}
		}
	}
}
