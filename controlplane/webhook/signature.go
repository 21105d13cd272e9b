package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"strings"
)

// Header names GitHub sets on every webhook delivery.
const (
	// SignatureHeader carries "sha256=" + hex HMAC-SHA256 of the raw body.
	SignatureHeader = "X-Hub-Signature-256"
	// EventHeader names the event, e.g. "push" or "workflow_run".
	EventHeader = "X-GitHub-Event"
	// DeliveryHeader carries the delivery's GUID; a redelivery repeats it.
	DeliveryHeader = "X-GitHub-Delivery"
)

// SignaturePrefix is the only accepted signature scheme prefix.
const SignaturePrefix = "sha256="

// Errors returned by [Verify]. They never carry the secret or a signature.
var (
	// ErrEmptySecret is returned when the configured secret is empty: an
	// empty HMAC key would let anyone forge deliveries.
	ErrEmptySecret = errors.New("webhook: webhook secret is empty")
	// ErrMissingSignature is returned when the X-Hub-Signature-256 header is
	// absent or empty.
	ErrMissingSignature = errors.New("webhook: missing " + SignatureHeader + " header")
	// ErrBadSignature is returned when the header is present but is not a
	// well-formed "sha256=<64 hex digits>" value or does not match the body.
	ErrBadSignature = errors.New("webhook: bad " + SignatureHeader + " signature")
)

// Sign returns the X-Hub-Signature-256 header value GitHub would send for
// body: "sha256=" followed by the lowercase hex HMAC-SHA256 of body keyed by
// secret.
func Sign(secret, body []byte) string {
	return SignaturePrefix + hex.EncodeToString(mac(secret, body))
}

// Verify checks signatureHeader (the value of X-Hub-Signature-256) against
// body in constant time. It returns nil only for a "sha256=" signature that
// matches; "sha1=" and every other scheme are rejected with
// [ErrBadSignature].
func Verify(secret, body []byte, signatureHeader string) error {
	v, err := NewVerifier(secret, signatureHeader)
	if err != nil {
		return err
	}
	_, _ = v.Write(body)
	return v.Verify()
}

// Verifier checks a signature over a body written to it in pieces, so that
// the MAC is computed while the body is read and a request without a
// well-formed signature is refused before its body is read at all.
type Verifier struct {
	want []byte
	mac  hash.Hash
}

// NewVerifier parses signatureHeader (the value of X-Hub-Signature-256):
// it returns [ErrEmptySecret] for an empty secret, [ErrMissingSignature]
// for an empty header and [ErrBadSignature] for anything but "sha256="
// followed by 64 hex digits. Write the body to the Verifier, then call
// [Verifier.Verify].
func NewVerifier(secret []byte, signatureHeader string) (*Verifier, error) {
	if len(secret) == 0 {
		return nil, ErrEmptySecret
	}
	if signatureHeader == "" {
		return nil, ErrMissingSignature
	}
	hexSig, ok := strings.CutPrefix(signatureHeader, SignaturePrefix)
	if !ok || len(hexSig) != hex.EncodedLen(sha256.Size) {
		return nil, ErrBadSignature
	}
	want, err := hex.DecodeString(hexSig)
	if err != nil {
		return nil, ErrBadSignature
	}
	return &Verifier{want: want, mac: hmac.New(sha256.New, secret)}, nil
}

// Write adds p to the MAC; it never fails.
func (v *Verifier) Write(p []byte) (int, error) { return v.mac.Write(p) }

// Verify compares, in constant time, the MAC of everything written with
// the signature: nil when they match, [ErrBadSignature] otherwise.
func (v *Verifier) Verify() error {
	if !hmac.Equal(v.want, v.mac.Sum(nil)) {
		return ErrBadSignature
	}
	return nil
}

func mac(secret, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(body)
	return h.Sum(nil)
}
