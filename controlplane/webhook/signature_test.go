package webhook_test

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

func TestSignMatchesGitHubsDocumentedExample(t *testing.T) {
	t.Parallel()
	// The worked example of GitHub's "Validating webhook deliveries" page.
	got := webhook.Sign([]byte("It's a Secret to Everybody"), []byte("Hello, World!"))
	const want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
}

func TestVerify(t *testing.T) {
	t.Parallel()
	secret := []byte("s3cr3t-canary-value")
	body := []byte(`{"zen":"Keep it logically awesome."}`)
	good := webhook.Sign(secret, body)
	sha1Mac := hmac.New(sha1.New, secret)
	sha1Mac.Write(body)
	sha1Header := "sha1=" + hex.EncodeToString(sha1Mac.Sum(nil))
	hexPart := strings.TrimPrefix(good, "sha256=")

	tests := []struct {
		name   string
		secret []byte
		body   []byte
		header string
		want   error
	}{
		{name: "good", secret: secret, body: body, header: good},
		{name: "good uppercase hex", secret: secret, body: body, header: "sha256=" + strings.ToUpper(hexPart)},
		{name: "tampered body", secret: secret, body: append([]byte(`{"x":1,`), body[1:]...), header: good, want: webhook.ErrBadSignature},
		{name: "wrong secret", secret: []byte("other"), body: body, header: good, want: webhook.ErrBadSignature},
		{name: "missing", secret: secret, body: body, header: "", want: webhook.ErrMissingSignature},
		{name: "sha1 only", secret: secret, body: body, header: sha1Header, want: webhook.ErrBadSignature},
		{name: "wrong prefix", secret: secret, body: body, header: "sha512=" + hexPart, want: webhook.ErrBadSignature},
		{name: "uppercase prefix", secret: secret, body: body, header: "SHA256=" + hexPart, want: webhook.ErrBadSignature},
		{name: "no prefix", secret: secret, body: body, header: hexPart, want: webhook.ErrBadSignature},
		{name: "non-hex", secret: secret, body: body, header: "sha256=" + strings.Repeat("zz", 32), want: webhook.ErrBadSignature},
		{name: "short", secret: secret, body: body, header: good[:len(good)-2], want: webhook.ErrBadSignature},
		{name: "long", secret: secret, body: body, header: good + "00", want: webhook.ErrBadSignature},
		{name: "leading space", secret: secret, body: body, header: " " + good, want: webhook.ErrBadSignature},
		{name: "empty secret", secret: nil, body: body, header: webhook.Sign(nil, body), want: webhook.ErrEmptySecret},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := webhook.Verify(tt.secret, tt.body, tt.header)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Verify = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
			for _, secretish := range []string{string(secret), hexPart} {
				if strings.Contains(err.Error(), secretish) {
					t.Fatalf("error text %q leaks %q", err, secretish)
				}
			}
		})
	}
}

// TestVerifierStreams: the body written in pieces verifies as a whole, one
// byte more or less does not, and a malformed header is refused before
// anything is written.
func TestVerifierStreams(t *testing.T) {
	t.Parallel()
	secret := []byte("It's a Secret to Everybody")
	body := []byte("Hello, World!")
	sig := webhook.Sign(secret, body)
	v, err := webhook.NewVerifier(secret, sig)
	if err != nil {
		t.Fatal(err)
	}
	for _, piece := range [][]byte{body[:3], body[3:4], body[4:]} {
		_, _ = v.Write(piece)
	}
	if err := v.Verify(); err != nil {
		t.Fatalf("pieces: %v", err)
	}
	for _, other := range [][]byte{body[:len(body)-1], append([]byte(string(body)), '!')} {
		v, _ := webhook.NewVerifier(secret, sig)
		_, _ = v.Write(other)
		if err := v.Verify(); !errors.Is(err, webhook.ErrBadSignature) {
			t.Errorf("%q: %v, want ErrBadSignature", other, err)
		}
	}
	for header, want := range map[string]error{"": webhook.ErrMissingSignature, "sha256=zz": webhook.ErrBadSignature,
		"sha1=" + strings.Repeat("0", 40): webhook.ErrBadSignature} {
		if _, err := webhook.NewVerifier(secret, header); !errors.Is(err, want) {
			t.Errorf("header %q: %v, want %v", header, err, want)
		}
	}
	if _, err := webhook.NewVerifier(nil, sig); !errors.Is(err, webhook.ErrEmptySecret) {
		t.Errorf("empty secret: %v", err)
	}
}
