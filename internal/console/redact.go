package console

import (
	"bytes"
	"encoding/json"
	"regexp"

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

var (
	// bearerRE: an Authorization scheme followed by its credential.
	bearerRE = regexp.MustCompile(`(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{6,}`)
	// userinfoRE: a URL's user:password@.
	userinfoRE = regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`)
	// pairRE: key=value (a query string, a DSN) and "key": "value" (JSON).
	pairRE = regexp.MustCompile(`([A-Za-z0-9_.-]+)(=|"\s*:\s*")([^\s&",;]+)`)
)

// RedactError returns an error text (last_error, an attempt's error) with
// anything that looks like a credential replaced by Redacted: the value of
// key=value and "key": "value" pairs whose key pgoutbox.IsCredentialKey
// reports, a Bearer or Basic credential, and a URL's user:password. Error
// texts are credential-safe at the source (targets scrub what they send,
// guarantee 6); this is the console's second wall.
func RedactError(s string) string {
	s = bearerRE.ReplaceAllString(s, "${1}${2}"+Redacted)
	s = userinfoRE.ReplaceAllString(s, "://"+Redacted+"@")
	return pairRE.ReplaceAllStringFunc(s, func(m string) string {
		p := pairRE.FindStringSubmatch(m)
		if !pgoutbox.IsCredentialKey(p[1]) {
			return m
		}
		return p[1] + p[2] + Redacted
	})
}
