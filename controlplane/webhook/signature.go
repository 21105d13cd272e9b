package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	if len(secret) == 0 {
		return ErrEmptySecret
	}
	if signatureHeader == "" {
		return ErrMissingSignature
	}
	hexSig, ok := strings.CutPrefix(signatureHeader, SignaturePrefix)
	if !ok {
		return ErrBadSignature
	}
	if len(hexSig) != hex.EncodedLen(sha256.Size) {
		return ErrBadSignature
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return ErrBadSignature
	}
	if !hmac.Equal(got, mac(secret, body)) {
		return ErrBadSignature
	}
	return nil
}

func mac(secret, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(body)
	return h.Sum(nil)
}
