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
// Enqueue checks it in Go and the CHECK constraints effects_payload_size
// and stream_payload_size enforce it in the database, on the text jsonb
// writes (which can be longer than the text given).
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
// A batch of at least CopyThreshold effects reaches the server by COPY
// into a temporary table of tx (dropped before EnqueueBatch returns, and ON
// COMMIT DROP), from which that one statement reads it; a smaller batch
// is sent as parameter arrays. Both write the same rows and return the
// same ids and errors. The COPY form needs the TEMPORARY privilege on the
// database (granted to PUBLIC by default): for a role without it the batch
// is sent as arrays. A transaction that used it cannot PREPARE
// TRANSACTION: a two-phase commit sends batches of fewer than
// CopyThreshold effects.
//
// tx should be READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ
// or SERIALIZABLE, a key that a concurrent transaction committed after tx's
// snapshot cannot be returned (tx cannot see it): the enqueue fails with an
// error wrapping the *pgconn.PgError serialization_failure (SQLSTATE 40001)
// and writes nothing; retry the whole transaction, and the retry returns
// the existing effect.
//
// The enqueue is a span (docs/operations.md, "Tracing"): a PRODUCER span
// "send <queue>", of the provider of ctx's span when that span is recording,
// else of the global one (otel.GetTracerProvider()). When its span context
// is valid (an SDK is installed, or ctx carries a trace), each effect keeps
// its W3C traceparent and the delivery continues the trace; otherwise the
// effects keep none (NULL).
func EnqueueBatch(ctx context.Context, tx pgx.Tx, effects []Effect) ([]int64, error) {
	if tx == nil {
		return nil, &InvalidEffectError{Field: "tx", Reason: "is nil: effects are enqueued inside the caller's transaction"}
	}
	if len(effects) == 0 {
		return nil, nil
	}
	traceparent, end := enqueueSpan(ctx, effects)
	ids, err := enqueueBatch(ctx, tx, effects, traceparent)
	end(ids, err)
	return ids, err
}

// CopyThreshold is the smallest batch EnqueueBatch sends by COPY rather
// than as parameter arrays (1,000 effects), where the two measured even
// here (docs/benchmarks.md, "Enqueue"): the COPY form costs three more
// round trips (create the temporary table, COPY, drop it), which made it
// 0.86× the arrays' rate at 250 effects a batch, 1.02× at 1,000 and
// 1.1-1.3× from 2,000.
const CopyThreshold = 1000

// enqueuePath chooses how enqueueBatch sends a batch.
type enqueuePath int

const (
	pathAuto   enqueuePath = iota // COPY from CopyThreshold effects on
	pathArrays                    // parameter arrays
	pathCopy                      // COPY into a temporary table
)

// enqueueBatch is EnqueueBatch, each effect keeping traceparent ("" none).
func enqueueBatch(ctx context.Context, tx pgx.Tx, effects []Effect, traceparent string) ([]int64, error) {
	return enqueueBatchVia(ctx, tx, effects, traceparent, pathAuto)
}

// enqueueBatchVia is enqueueBatch sending the batch by path.
func enqueueBatchVia(ctx context.Context, tx pgx.Tx, effects []Effect, traceparent string, path enqueuePath) ([]int64, error) {
	rows := make([]store.NewEffect, len(effects))
	for i, e := range effects {
		ne, err := prepare(e)
		if err != nil {
			if len(effects) > 1 {
				return nil, fmt.Errorf("effect %d: %w", i, err)
			}
			return nil, err
		}
		ne.Traceparent = traceparent
		rows[i] = ne
	}
	if path == pathAuto {
		path = pathArrays
		if len(rows) >= CopyThreshold {
			path = pathCopy
		}
	}
	var res []store.Inserted
	var err error
	if path == pathCopy {
		res, err = store.InsertCopy(ctx, tx, rows)
	} else {
		res, err = store.Insert(ctx, tx, rows)
	}
	if err != nil {
		var v *store.Violation
		if errors.As(err, &v) && (v.Constraint == "effects_payload_size" || v.Constraint == "stream_payload_size") {
			// The payload fits as given, but not as jsonb's text, which
			// spells numbers out; which one, in a batch, is not known.
			e := &PayloadTooLargeError{Limit: MaxPayloadBytes, Stored: true}
			if len(rows) == 1 {
				e.Size = len(rows[0].Payload)
			}
			return nil, e
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
	// One linear walk: the bounds (before json.Valid, whose own depth
	// limit is 10,000) and the credential keys.
	w := keyWalkers.Get().(*keyWalker)
	defer keyWalkers.Put(w)
	if reason := w.scan(raw, true); reason != "" {
		return nil, &InvalidEffectError{Field: "Payload", Reason: reason}
	}
	// json.Marshal's output is valid JSON (it checks what MarshalJSON
	// methods return); bytes given as they are must be checked.
	if !marshaled && !json.Valid(raw) {
		return nil, &InvalidEffectError{Field: "Payload", Reason: "is not valid JSON"}
	}
	if w.credPath != "" {
		return nil, &CredentialKeyError{Path: w.credPath}
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

// MaxPayloadDepth is the deepest nesting of arrays and objects that a
// payload may have (64: {"a":[1]} nests 2 deep). Real payloads nest a few
// levels (a GitHub webhook: 6); the bound keeps the credential-key guard's
// cost proportional to the payload's size. Go's Enqueue, the SQL API and the
// projection's records check it before anything parses the JSON into jsonb.
const MaxPayloadDepth = 64

// MaxNumberLength is the longest number literal, in characters, that a
// payload may carry (100: float64's longest shortest form is 24). jsonb
// stores numbers as numeric, spelled out in full.
const MaxNumberLength = 100

// MaxNumberExponent is the largest exponent, in magnitude, of a number
// literal in a payload (400: float64 spans 1e-324 to 1.8e308). A larger one
// costs jsonb as many digits: 1e131071 is 8 bytes of JSON and 131,072 digits
// of numeric.
const MaxNumberExponent = 400

// JSONBoundsError reports a JSON value outside the bounds that every entry
// point checks before PostgreSQL parses it into jsonb: MaxPayloadDepth,
// MaxNumberLength, MaxNumberExponent. Enqueue reports it as an
// *InvalidEffectError on Payload with the same Reason.
type JSONBoundsError struct {
	// Reason says which bound, e.g. "nests deeper than 64 levels of arrays
	// and objects".
	Reason string
}

func (e *JSONBoundsError) Error() string { return "pgoutbox: JSON value " + e.Reason }

// The bounds' reasons, in the order of precedence (the SQL API's, too).
var (
	reasonTooDeep     = fmt.Sprintf("nests deeper than %d levels of arrays and objects", MaxPayloadDepth)
	reasonLongNumber  = fmt.Sprintf("has a number literal longer than %d characters", MaxNumberLength)
	reasonBigExponent = fmt.Sprintf("has a number with an exponent beyond ±%d", MaxNumberExponent)
)

// CheckJSONBounds returns a *JSONBoundsError when raw nests deeper than
// MaxPayloadDepth or carries a number literal longer than MaxNumberLength
// or with an exponent beyond MaxNumberExponent, and nil otherwise
// (including when raw is not valid JSON: check that separately). Its cost
// is linear in len(raw) and it stops at the first level too deep.
func CheckJSONBounds(raw []byte) error {
	w := keyWalkers.Get().(*keyWalker)
	defer keyWalkers.Put(w)
	if reason := w.scan(raw, false); reason != "" {
		return &JSONBoundsError{Reason: reason}
	}
	return nil
}

// scan walks raw once and returns the first bound it breaks, by precedence
// (depth, then number length, then exponent); with keys, it also records
// in w.credPath the path of the first object key in document order that
// looks like a credential (every occurrence of a repeated key included).
// The walk reads tokens with jsontext (encoding/json/v2's token layer),
// which neither allocates per token nor reflects; its duplicate name and
// UTF-8 checks are off, so it accepts what json.Valid accepts. It stops at
// the first syntax error (json.Valid reports it).
func (w *keyWalker) scan(raw []byte, keys bool) string {
	w.r.Reset(raw)
	w.dec.Reset(&w.r, jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	w.names = w.names[:0]
	w.credPath = ""
	longNumber, bigExponent := false, false
	for {
		if w.dec.PeekKind() == '0' {
			v, err := w.dec.ReadValue()
			if err != nil {
				break
			}
			if len(v) > MaxNumberLength {
				longNumber = true
			} else if exponentTooLarge(v) {
				bigExponent = true
			}
			continue
		}
		tok, err := w.dec.ReadToken()
		if err != nil {
			break
		}
		switch tok.Kind() {
		case '{', '[':
			if w.dec.StackDepth() > MaxPayloadDepth {
				return reasonTooDeep
			}
			continue
		case '"':
		default:
			continue
		}
		if !keys || w.credPath != "" {
			continue
		}
		depth := w.dec.StackDepth()
		if kind, n := w.dec.StackIndex(depth); kind != '{' || n%2 == 0 {
			continue // a string value, not a name
		}
		name := tok.String()
		if IsCredentialKey(name) {
			w.credPath = w.path(depth, name)
			continue
		}
		for len(w.names) < depth {
			w.names = append(w.names, "")
		}
		w.names[depth-1] = name
	}
	switch {
	case longNumber:
		return reasonLongNumber
	case bigExponent:
		return reasonBigExponent
	}
	return ""
}

// exponentTooLarge reports whether the JSON number literal v has an
// exponent beyond ±MaxNumberExponent (leading zeros of the exponent do not
// count).
func exponentTooLarge(v []byte) bool {
	i := bytes.IndexAny(v, "eE")
	if i < 0 {
		return false
	}
	e := v[i+1:]
	if len(e) > 0 && (e[0] == '+' || e[0] == '-') {
		e = e[1:]
	}
	e = bytes.TrimLeft(e, "0")
	if len(e) > 3 {
		return true
	}
	n := 0
	for _, c := range e {
		n = n*10 + int(c-'0')
	}
	return n > MaxNumberExponent
}

// keyWalker is scan's reusable state.
type keyWalker struct {
	r        bytes.Reader
	dec      jsontext.Decoder
	names    []string // names[d-1]: the current member name of the object at depth d
	credPath string   // the first credential key's path, "" if none (scan with keys)
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
