package console

import (
	"bytes"
	"encoding/json"

	"github.com/pgoutbox/pgoutbox"
)

// Redacted replaces the value under a credential-like key.
const Redacted = "[redacted]"

// RedactPayload returns payload as indented JSON with the value of every
// object key that pgoutbox.IsCredentialKey reports, at any depth, replaced
// by Redacted. A payload that is not JSON is not shown at all.
func RedactPayload(payload []byte) string {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "(payload is not JSON; not shown)"
	}
	out, err := json.MarshalIndent(redact(v), "", "  ")
	if err != nil {
		return "(payload could not be shown)"
	}
	return string(out)
}

func redact(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if pgoutbox.IsCredentialKey(k) {
				t[k] = Redacted
			} else {
				t[k] = redact(x)
			}
		}
	case []any:
		for i, x := range t {
			t[i] = redact(x)
		}
	}
	return v
}
