package pgoutbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/store"
)

// MaxPayloadBytes is the largest JSON payload an effect may carry (64 KiB).
// Enqueue checks it in Go and the CHECK constraint effects_payload_size
// enforces it in the database.
const MaxPayloadBytes = 64 << 10

// MaxAttemptsDefault is the number of delivery attempts after which an effect
// is dead-lettered when Effect.MaxAttempts is zero (OUTBOX_MAX_ATTEMPTS).
const MaxAttemptsDefault = 8

// Effect is a side effect owed to the outside world, written in the same
// transaction as the state change that caused it.
type Effect struct {
	// Queue selects the worker pool. Required.
	Queue string
	// Type is the registered effect type (e.g. "record.upsert"). Required.
	Type string
	// Key is the idempotency key, unique per queue: enqueuing a key that
	// exists returns the existing id and writes nothing. Required; build it
	// with Key.
	Key string
	// Payload is marshalled with encoding/json; a json.RawMessage or []byte
	// is used as is (it must be valid JSON). Nil means {}. At most
	// MaxPayloadBytes, and no key may look like a credential.
	Payload any
	// MaxAttempts is the delivery attempts before dead-lettering; zero means
	// MaxAttemptsDefault.
	MaxAttempts int
	// AvailableAt schedules the first attempt at an absolute instant. It is
	// stored as given and compared with the database clock, so a skew
	// between this process's clock and the database's moves it; to delay by
	// a duration, use Delay. Zero means the database's now().
	AvailableAt time.Time
	// Delay schedules the first attempt Delay after the enqueue, measured
	// on the database clock (now() + Delay), whatever this process's clock
	// says. It must not be negative, and it cannot be combined with
	// AvailableAt. Zero means no delay.
	Delay time.Duration
	// OrderingKey, when set, orders the effect among the effects of its
	// queue that share the key: they are delivered one at a time, in the
	// order their enqueuing transactions committed (docs/design.md,
	// "Per-key ordering"). The enqueue takes a lock on (Queue,
	// OrderingKey) (one of 256 stripes per queue) that it holds until tx
	// ends, so transactions enqueuing to one key commit one after the
	// other; enqueue a transaction's ordered effects in one batch, or two
	// transactions enqueuing in several statements may deadlock
	// (PostgreSQL then aborts one with 40P01: retry it). At most 512 bytes,
	// not only white space. Empty means none: the effect is not held back
	// by any other.
	OrderingKey string
}

// Key returns a deterministic idempotency key: the hex SHA-256 of the parts
// joined by "|". Key("record.upsert", id, hash) is the projection's key.
func Key(parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "|")))
	return hex.EncodeToString(sum[:])
}

// Enqueue writes one effect inside tx and returns its id. The effect exists if
// and only if tx commits. A duplicate key in the same queue returns the
// existing id and writes nothing. Invalid input returns a typed error
// (*InvalidEffectError, *PayloadTooLargeError, *CredentialKeyError) and writes
// nothing.
func Enqueue(ctx context.Context, tx pgx.Tx, e Effect) (int64, error) {
	ids, err := EnqueueBatch(ctx, tx, []Effect{e})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// EnqueueBatch writes effects inside tx in one statement and returns their ids
// in input order. Every effect is validated before anything is written: one bad
// effect fails the whole batch.
//
// tx should be READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ
// or SERIALIZABLE, a key that a concurrent transaction committed after tx's
// snapshot cannot be returned (tx cannot see it): the enqueue fails with an
// error wrapping the *pgconn.PgError serialization_failure (SQLSTATE 40001)
// and writes nothing; retry the whole transaction, and the retry returns
// the existing effect.
func EnqueueBatch(ctx context.Context, tx pgx.Tx, effects []Effect) ([]int64, error) {
	if tx == nil {
		return nil, &InvalidEffectError{Field: "tx", Reason: "is nil: effects are enqueued inside the caller's transaction"}
	}
	if len(effects) == 0 {
		return nil, nil
	}
	rows := make([]store.NewEffect, len(effects))
	for i, e := range effects {
		ne, err := prepare(e)
		if err != nil {
			if len(effects) > 1 {
				return nil, fmt.Errorf("effect %d: %w", i, err)
			}
			return nil, err
		}
		rows[i] = ne
	}
	res, err := store.Insert(ctx, tx, rows)
	if err != nil {
		var v *store.Violation
		if errors.As(err, &v) && v.Constraint == "effects_payload_size" {
			return nil, &PayloadTooLargeError{Size: -1, Limit: MaxPayloadBytes}
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40001" {
			return nil, fmt.Errorf("pgoutbox: enqueue: serialization failure: under REPEATABLE READ or SERIALIZABLE "+
				"a key committed by a concurrent transaction after this transaction's snapshot cannot be returned; "+
				"retry the transaction (the retry returns the existing effect): %w", err)
		}
		return nil, fmt.Errorf("pgoutbox: enqueue: %w", err)
	}
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.ID
	}
	return ids, nil
}

func prepare(e Effect) (store.NewEffect, error) {
	switch {
	case strings.TrimSpace(e.Queue) == "" || len(e.Queue) > 128:
		return store.NewEffect{}, &InvalidEffectError{Field: "Queue", Reason: "must be 1-128 characters"}
	case strings.TrimSpace(e.Type) == "" || len(e.Type) > 128:
		return store.NewEffect{}, &InvalidEffectError{Field: "Type", Reason: "must be 1-128 characters"}
	case strings.TrimSpace(e.Key) == "" || len(e.Key) > 512:
		return store.NewEffect{}, &InvalidEffectError{Field: "Key", Reason: "must be 1-512 characters"}
	case e.OrderingKey != "" && (strings.TrimSpace(e.OrderingKey) == "" || len(e.OrderingKey) > 512):
		return store.NewEffect{}, &InvalidEffectError{Field: "OrderingKey", Reason: "must be empty (none) or 1-512 characters, not only white space"}
	case e.MaxAttempts < 0 || e.MaxAttempts > 1000:
		return store.NewEffect{}, &InvalidEffectError{Field: "MaxAttempts", Reason: "must be between 0 (default) and 1000"}
	case e.Delay < 0:
		return store.NewEffect{}, &InvalidEffectError{Field: "Delay", Reason: "must not be negative"}
	case e.Delay > 0 && !e.AvailableAt.IsZero():
		return store.NewEffect{}, &InvalidEffectError{Field: "Delay", Reason: "cannot be combined with AvailableAt"}
	}
	payload, err := encodePayload(e.Payload)
	if err != nil {
		return store.NewEffect{}, err
	}
	ne := store.NewEffect{Queue: e.Queue, Type: e.Type, Key: e.Key, Payload: payload, MaxAttempts: e.MaxAttempts,
		OrderingKey: e.OrderingKey}
	if ne.MaxAttempts == 0 {
		ne.MaxAttempts = MaxAttemptsDefault
	}
	if !e.AvailableAt.IsZero() {
		t := e.AvailableAt
		ne.AvailableAt = &t
	}
	ne.Delay = e.Delay
	return ne, nil
}

func encodePayload(p any) ([]byte, error) {
	var raw []byte
	marshaled := false
	switch v := p.(type) {
	case nil:
		raw = []byte("{}")
	case json.RawMessage:
		raw = v
	case []byte:
		raw = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, &InvalidEffectError{Field: "Payload", Reason: "cannot be encoded as JSON: " + err.Error()}
		}
		raw = b
		marshaled = true
	}
	if len(raw) > MaxPayloadBytes {
		return nil, &PayloadTooLargeError{Size: len(raw), Limit: MaxPayloadBytes}
	}
	// json.Marshal's output is valid JSON (it checks what MarshalJSON
	// methods return); bytes given as they are must be checked.
	if !marshaled && !json.Valid(raw) {
		return nil, &InvalidEffectError{Field: "Payload", Reason: "is not valid JSON"}
	}
	if path, ok := findCredentialKey(raw); ok {
		return nil, &CredentialKeyError{Path: path}
	}
	return raw, nil
}

// credentialWords are the key words that mark a credential, compared after
// splitting a key into lower-case words (snake_case, kebab-case, camelCase).
// Besides the secrets themselves (token, secret, password and its short
// forms pwd/passwd/passcode/passphrase, private key) they name the carriers
// of one: an authorization or auth header, a bearer, a JWT, a DSN (a
// connection string embeds its password), cookies, and session ids under
// the names web frameworks give their session cookies (sessionid, sessid,
// PHPSESSID, JSESSIONID). Deliberately not words: "auth…" words other than
// auth itself (author, authority, authenticated, oauth), "session" alone
// (a conference session, a session name) and "sid" alone (an account SID
// is an identifier).
var credentialWords = map[string]bool{
	"token": true, "tokens": true, "secret": true, "secrets": true, "password": true,
	"passwd": true, "passphrase": true, "authorization": true, "credential": true,
	"credentials": true, "apikey": true, "privatekey": true, "cookie": true,
	"pwd": true, "passcode": true, "auth": true, "bearer": true, "jwt": true, "dsn": true,
	"cookies": true, "privkey": true, "sessionid": true, "sessid": true, "phpsessid": true,
	"jsessionid": true,
}

// credentialPairs are two-word credentials ("private_key", "apiKey"), and
// session ids spelled as two words ("session_id", "sessionId",
// "ASP.NET_SessionId", "session_key") or as Express names its cookie
// ("connect.sid"). A session id is a bearer credential: whoever holds it is
// logged in; a payload that must refer to a session carries a reference of
// its own instead (a hash, an internal id).
var credentialPairs = map[[2]string]bool{
	{"private", "key"}: true, {"api", "key"}: true, {"access", "key"}: true, {"secret", "key"}: true,
	{"session", "id"}: true, {"session", "key"}: true, {"connect", "sid"}: true,
}

// IsCredentialKey reports whether a payload key looks like a credential.
// The key is split into lower-case words at every character that is not a
// letter or digit and at camelCase boundaries (APIKey → api, key); it is a
// credential key when one word is in the word list — token(s), secret(s),
// password, passwd, pwd, passcode, passphrase, authorization, auth,
// bearer, jwt, dsn, credential(s), apikey, privatekey, privkey, cookie(s),
// sessionid, sessid, phpsessid, jsessionid — or two adjacent words are one
// of the pairs private key, api key, access key, secret key, session id,
// session key, connect sid. Words are compared whole: "author",
// "authority", "tokenizer", "keys", "session" and "session_name" are not
// credential keys.
func IsCredentialKey(key string) bool {
	return mayBeCredentialKey(key) && hasCredentialWord(key)
}

// credentialStems are substrings that every credential word or pair
// contains (token, secret, passw…/passphrase/passcode, authorization/auth,
// credential, …key, cookie, pwd, bearer, jwt, dsn, sess…, sid), in lower
// case.
var credentialStems = []string{"token", "secret", "pass", "auth", "credential", "key", "cookie",
	"pwd", "bearer", "jwt", "dsn", "sess", "sid"}

// mayBeCredentialKey is IsCredentialKey's allocation-free pre-check: an ASCII
// key that contains no credential stem in any case cannot hold a credential
// word, so most keys are settled without splitting them into words. A key
// with any non-ASCII byte goes to the full check, because Unicode case
// folding can turn other letters into ASCII ones (the Kelvin sign into k).
func mayBeCredentialKey(key string) bool {
	for i := 0; i < len(key); i++ {
		if key[i] >= 0x80 {
			return true
		}
	}
	for _, stem := range credentialStems {
		if containsFoldASCII(key, stem) {
			return true
		}
	}
	return false
}

// containsFoldASCII reports whether s contains lower (lower-case ASCII) in
// any ASCII case.
func containsFoldASCII(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for ; j < len(lower); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != lower[j] {
				break
			}
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

// hasCredentialWord is the full check: key split into lower-case words
// (snake_case, kebab-case, camelCase) holds a credential word or pair.
func hasCredentialWord(key string) bool {
	words := splitWords(key)
	for i, w := range words {
		if credentialWords[w] {
			return true
		}
		if i > 0 && credentialPairs[[2]string{words[i-1], w}] {
			return true
		}
	}
	return false
}

func splitWords(key string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	rs := []rune(key)
	for i, r := range rs {
		switch {
		case !unicode.IsLetter(r) && !unicode.IsDigit(r):
			flush()
		case unicode.IsUpper(r) && i > 0 && (unicode.IsLower(rs[i-1]) ||
			(i+1 < len(rs) && unicode.IsLower(rs[i+1]) && unicode.IsUpper(rs[i-1]))):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
	}
	flush()
	return words
}

// findCredentialKey walks every object key at any depth, every occurrence of
// a repeated key included, and returns the first credential key's path
// ($.a[0].b). raw has passed json.Valid. The walk reads tokens with
// jsontext (encoding/json/v2's token layer), which neither allocates per
// token nor reflects, unlike encoding/json's Decoder.Token; its duplicate
// name and UTF-8 checks are off, so it accepts what json.Valid accepts.
func findCredentialKey(raw []byte) (string, bool) {
	w := keyWalkers.Get().(*keyWalker)
	defer keyWalkers.Put(w)
	w.r.Reset(raw)
	w.dec.Reset(&w.r, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	w.names = w.names[:0]
	for {
		tok, err := w.dec.ReadToken()
		if err != nil {
			return "", false
		}
		if tok.Kind() != '"' {
			continue
		}
		depth := w.dec.StackDepth()
		if kind, n := w.dec.StackIndex(depth); kind != '{' || n%2 == 0 {
			continue // a string value, not a name
		}
		name := tok.String()
		if IsCredentialKey(name) {
			return w.path(depth, name), true
		}
		for len(w.names) < depth {
			w.names = append(w.names, "")
		}
		w.names[depth-1] = name
	}
}

// keyWalker is findCredentialKey's reusable state.
type keyWalker struct {
	r     bytes.Reader
	dec   jsontext.Decoder
	names []string // names[d-1]: the current member name of the object at depth d
}

var keyWalkers = sync.Pool{New: func() any { return new(keyWalker) }}

// path renders the position of name, read in the object at depth, as
// $.a[0].b: ancestors' member names and array indices, then name.
func (w *keyWalker) path(depth int, name string) string {
	var b strings.Builder
	b.WriteString("$")
	for d := 1; d < depth; d++ {
		if kind, n := w.dec.StackIndex(d); kind == '[' {
			fmt.Fprintf(&b, "[%d]", n-1)
		} else {
			b.WriteString("." + w.names[d-1])
		}
	}
	b.WriteString("." + name)
	return b.String()
}
