package pgoutbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// credentialOracle decodes raw independently of findCredentialKey (by
// recursive descent, each value read whole as json.RawMessage) and reports
// whether any object key at any depth is a credential key. It visits every
// occurrence of a repeated key, because the guard reads the payload's text,
// not the object a decoder would keep (which holds only the last value).
func credentialOracle(raw []byte) (bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '{' && raw[0] != '[') {
		return false, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{' or '['
		return false, err
	}
	for dec.More() {
		if raw[0] == '{' {
			k, err := dec.Token()
			if err != nil {
				return false, err
			}
			if IsCredentialKey(k.(string)) {
				return true, nil
			}
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return false, err
		}
		if cred, err := credentialOracle(v); cred || err != nil {
			return cred, err
		}
	}
	return false, nil
}

// seedWebhookPayloads adds GitHub's published webhook payloads (the
// repository's testdata/github-webhooks) that fit in an effect. A missing or
// thin corpus fails the fuzz target instead of seeding nothing.
func seedWebhookPayloads(f *testing.F, limit int) {
	files, err := filepath.Glob("testdata/github-webhooks/*/*.json")
	if err != nil || len(files) < 100 {
		f.Fatalf("webhook payload corpus: %d files under testdata/github-webhooks (%v), want at least 100", len(files), err)
	}
	added := 0
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) <= limit {
			f.Add(b)
			added++
		}
	}
	if added == 0 {
		f.Fatalf("no webhook payload of at most %d bytes to seed", limit)
	}
}

// FuzzPayloadCredentialGuard checks Enqueue's payload validation (prepare)
// against an independent decoder: a payload with a credential-looking key
// at any depth is refused with *CredentialKeyError, one without is
// accepted, invalid JSON and oversize payloads get their own typed errors,
// and an accepted payload is stored byte for byte.
func FuzzPayloadCredentialGuard(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `null`, `{"a":1}`, `{"token":"x"}`, `{"a":{"b":[{"apiKey":1}]}}`,
		`{"":"x","token":"s3cr3t"}`, `{"":"token"}`, `{"a":"","password":"p"}`,
		`{"private_key":null}`, `{"x":[1,"token",{"y":{}}],"z":{"Authorization":"Bearer"}}`,
		`{"a":1,"a":{"secret":2}}`, `{"":{"token":null},"":{}}`, `"token"`, `[{"cookie":1}]`, `{"PRIVATE_KEY":1}`, `{"pass word":1}`,
	} {
		f.Add([]byte(s))
	}
	seedWebhookPayloads(f, 8<<10)
	f.Fuzz(func(t *testing.T, raw []byte) {
		ne, err := prepare(Effect{Queue: "q", Type: "t", Key: "k", Payload: json.RawMessage(raw)})
		switch {
		case len(raw) > MaxPayloadBytes:
			if !errors.Is(err, ErrPayloadTooLarge) {
				t.Fatalf("%d-byte payload: %v, want ErrPayloadTooLarge", len(raw), err)
			}
			return
		case !json.Valid(raw):
			if !errors.Is(err, ErrInvalidEffect) {
				t.Fatalf("invalid JSON %q: %v, want ErrInvalidEffect", raw, err)
			}
			return
		}
		cred, oerr := credentialOracle(raw)
		if oerr != nil {
			t.Fatalf("json.Valid accepted %q but decoding failed: %v", raw, oerr)
		}
		if cred {
			if !errors.Is(err, ErrCredentialKey) {
				t.Fatalf("payload %q carries a credential key, but prepare returned %v", raw, err)
			}
			var ce *CredentialKeyError
			if !errors.As(err, &ce) || !strings.HasPrefix(ce.Path, "$") {
				t.Fatalf("credential error %v has no $-path", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("payload %q has no credential key, but prepare returned %v", raw, err)
		}
		if !bytes.Equal(ne.Payload, raw) {
			t.Fatalf("payload changed: %q → %q", raw, ne.Payload)
		}
	})
}

// FuzzIsCredentialKey checks properties of the key classifier: it never
// panics; its allocation-free pre-check never settles a key differently from
// the full word split; adding a separated word before or after a credential key keeps it
// a credential key; and a key made of lower-case ASCII letters, digits, '_'
// and '-' is classified the same in SCREAMING_SNAKE case.
func FuzzIsCredentialKey(f *testing.F) {
	for _, s := range []string{
		"token", "accessToken", "access_token", "X-Api-Key", "apikey", "APIKey", "private_key",
		"privateKey", "PRIVATE-KEY", "client_secret", "passwd", "Authorization", "cookie", "tokenizer",
		"secretary", "keys", "api", "", "_", "ÄÖ", "aPIKey", "JWTToken", "sessionCookieName",
		"to\u212Aen", "PRIVATE_\u212AEY", "ſecret", "name", "repository", "Passphrase",
		"pwd", "auth", "author", "authority", "bearer", "jwt", "dsn", "PHPSESSID", "JSESSIONID", "sessionId",
		"session_id", "session", "connect.sid", "sid", "cookies", "passcode", "privkey", "oauth", "sessid",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		got := IsCredentialKey(key)
		if full := hasCredentialWord(key); got != full {
			t.Fatalf("IsCredentialKey(%q) = %v, but the word split alone says %v: the pre-check settled it wrongly", key, got, full)
		}
		if got {
			for _, k := range []string{"x_" + key, key + "_x", "x-" + key, key + ".x"} {
				if !IsCredentialKey(k) {
					t.Fatalf("IsCredentialKey(%q) is true but IsCredentialKey(%q) is false", key, k)
				}
			}
		}
		ascii := true
		for _, r := range key {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
				ascii = false
				break
			}
		}
		if ascii && IsCredentialKey(strings.ToUpper(key)) != got {
			t.Fatalf("IsCredentialKey(%q) = %v but IsCredentialKey(%q) = %v", key, got, strings.ToUpper(key), !got)
		}
	})
}

// TestCredentialKeyAfterEmptyKey is the regression case FuzzPayloadCredentialGuard
// seeds: findCredentialKey marks "expecting a key" with an empty frame.key, so
// after the key "" the next string is misread. {"":"x","token":"…"} is
// accepted (the value "x" is taken for a key, then "token" for a value) and
// {"":"token"} is refused for a key it does not have.
func TestCredentialKeyAfterEmptyKey(t *testing.T) {
	for _, tc := range []struct {
		payload string
		refuse  bool
	}{
		{`{"":"x","token":"s3cr3t"}`, true},
		{`{"":1,"password":"p"}`, true},
		{`{"":{},"apiKey":"k"}`, true},
		{`{"":"token"}`, false},
		{`{"":"x","y":"z"}`, false},
	} {
		_, err := prepare(Effect{Queue: "q", Type: "t", Key: "k", Payload: json.RawMessage(tc.payload)})
		if got := errors.Is(err, ErrCredentialKey); got != tc.refuse {
			t.Errorf("payload %s: refused as a credential = %v (err %v), want %v", tc.payload, got, err, tc.refuse)
		}
	}
}

// BenchmarkPrepare measures Enqueue's validation of one effect with a
// 300-byte JSON payload (a raw message, as an application that encodes its
// own payloads passes it): JSON validity and the credential-key walk.
func BenchmarkPrepare(b *testing.B) {
	payload := json.RawMessage(`{"release":{"id":123456,"tag":"v1.2.3","repository":"octo-org/octo-repo",` +
		`"sha":"6dcb09b5b57875f334f61aebed695e2e4193db5e","checks":[{"name":"build","status":"queued"},` +
		`{"name":"test","status":"queued"}],"notes":"` + strings.Repeat("x", 120) + `"}}`)
	e := Effect{Queue: "q", Type: "t", Key: "k", Payload: payload}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := prepare(e); err != nil {
			b.Fatal(err)
		}
	}
}
