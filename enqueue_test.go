package pgoutbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

func TestKey(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("record.upsert|r1|abc"))
	if got, want := pgoutbox.Key("record.upsert", "r1", "abc"), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("Key = %s, want %s", got, want)
	}
	if pgoutbox.Key("a", "b") == pgoutbox.Key("a", "c") {
		t.Fatal("different parts gave one key")
	}
}

func TestEnqueueDuplicateKeyWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := pgoutbox.Effect{Queue: "q", Type: "t", Key: "k1", Payload: map[string]any{"n": 1}}
	first := b.enqueue(t, e)[0]
	if first == 0 {
		t.Fatal("no id returned")
	}
	again := b.enqueue(t, e)[0]
	if again != first {
		t.Fatalf("duplicate key returned %d, want the existing %d", again, first)
	}
	// Same key in another queue is a different effect.
	other := b.enqueue(t, pgoutbox.Effect{Queue: "q2", Type: "t", Key: "k1"})[0]
	if other == first {
		t.Fatal("keys are unique per queue, not globally")
	}
	// A batch repeating a key and an existing key.
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "k2"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "k2"},
		pgoutbox.Effect{Queue: "q", Type: "t", Key: "k1"},
	)
	if ids[0] != ids[1] || ids[2] != first {
		t.Fatalf("batch ids %v: want [x x %d]", ids, first)
	}
	if n := b.count(t); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

func TestEnqueueRolledBackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t); n != 0 {
		t.Fatalf("%d effects after rollback, want 0", n)
	}
}

func TestEnqueueBadInputTypedErrorsWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "existing"})
	big := strings.Repeat("x", pgoutbox.MaxPayloadBytes)
	cases := []struct {
		name   string
		effect pgoutbox.Effect
		want   error
	}{
		{"too large", pgoutbox.Effect{Queue: "q", Type: "t", Key: "a", Payload: map[string]string{"s": big}}, pgoutbox.ErrPayloadTooLarge},
		{"token at top", pgoutbox.Effect{Queue: "q", Type: "t", Key: "b", Payload: map[string]any{"token": "x"}}, pgoutbox.ErrCredentialKey},
		{"nested private_key", pgoutbox.Effect{Queue: "q", Type: "t", Key: "c", Payload: map[string]any{"app": []any{1, map[string]any{"private_key": "x"}}}}, pgoutbox.ErrCredentialKey},
		{"camel apiKey", pgoutbox.Effect{Queue: "q", Type: "t", Key: "d", Payload: map[string]any{"cfg": map[string]any{"apiKey": "x"}}}, pgoutbox.ErrCredentialKey},
		{"Authorization", pgoutbox.Effect{Queue: "q", Type: "t", Key: "e", Payload: map[string]any{"headers": map[string]any{"Authorization": "x"}}}, pgoutbox.ErrCredentialKey},
		{"db_password", pgoutbox.Effect{Queue: "q", Type: "t", Key: "f", Payload: map[string]any{"db_password": "x"}}, pgoutbox.ErrCredentialKey},
		{"client-secret", pgoutbox.Effect{Queue: "q", Type: "t", Key: "g", Payload: map[string]any{"client-secret": "x"}}, pgoutbox.ErrCredentialKey},
		{"no queue", pgoutbox.Effect{Type: "t", Key: "h"}, pgoutbox.ErrInvalidEffect},
		{"no type", pgoutbox.Effect{Queue: "q", Key: "i"}, pgoutbox.ErrInvalidEffect},
		{"no key", pgoutbox.Effect{Queue: "q", Type: "t"}, pgoutbox.ErrInvalidEffect},
		{"invalid json", pgoutbox.Effect{Queue: "q", Type: "t", Key: "j", Payload: []byte("{nope")}, pgoutbox.ErrInvalidEffect},
		{"negative attempts", pgoutbox.Effect{Queue: "q", Type: "t", Key: "k", MaxAttempts: -1}, pgoutbox.ErrInvalidEffect},
		{"marshaler returns invalid json", pgoutbox.Effect{Queue: "q", Type: "t", Key: "l", Payload: badMarshaler{}}, pgoutbox.ErrInvalidEffect},
		{"credential in a json.RawMessage array", pgoutbox.Effect{Queue: "q", Type: "t", Key: "m", Payload: json.RawMessage(`[{"a":1},{"b":[{"Cookie":"x"}]}]`)}, pgoutbox.ErrCredentialKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := b.count(t)
			// A valid effect first in the same batch: the whole batch must fail.
			err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				_, err := pgoutbox.EnqueueBatch(b.ctx, tx, []pgoutbox.Effect{{Queue: "q", Type: "t", Key: "valid-" + tc.name}, tc.effect})
				return err
			})
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), `"x"`) {
				t.Fatalf("error text leaks a value: %v", err)
			}
			if after := b.count(t); after != before {
				t.Fatalf("rows %d → %d: bad input wrote something", before, after)
			}
		})
	}
	before := b.count(t)
	for payload, path := range map[string]string{
		`{"a":{"secret":1}}`:                                 "$.a.secret",
		`[{"a":1},{"b":[0,{"Cookie":"x"}]}]`:                 "$[1].b[1].Cookie",
		`{"a":[],"b":{"c":"d","e":[{"f":{}},{"apiKey":1}]}}`: "$.b.e[1].apiKey",
		`{"a":{"x":1},"a":{"token":2}}`:                      "$.a.token",
		// Issue 17, point 8: names the guard used to miss.
		`{"db":{"host":"h","pwd":"x"}}`:                   "$.db.pwd",
		`{"headers":[{"Auth":"x"}]}`:                      "$.headers[0].Auth",
		`{"sentryDsn":"x"}`:                               "$.sentryDsn",
		`{"author":"a","cookies":{"PHPSESSID":"x"}}`:      "$.cookies",
		`{"author":"a","session":"s","session_id":"x"}`:   "$.session_id",
		`{"authority":"a","meta":{"jwt":"x"}}`:            "$.meta.jwt",
		`{"kind":"bearer-holder","value":{"Bearer":"x"}}`: "$.value.Bearer",
	} {
		var cke *pgoutbox.CredentialKeyError
		_, err := enqueueOne(b, pgoutbox.Effect{Queue: "q", Type: "t", Key: "z", Payload: json.RawMessage(payload)})
		if !errors.As(err, &cke) || cke.Path != path {
			t.Fatalf("%s: want CredentialKeyError at %s, got %v", payload, path, err)
		}
	}
	if after := b.count(t); after != before {
		t.Fatalf("rows %d → %d: a refused payload wrote something", before, after)
	}
	// Keys that merely resemble the new words are accepted.
	if _, err := enqueueOne(b, pgoutbox.Effect{Queue: "q", Type: "t", Key: "lookalikes",
		Payload: json.RawMessage(`{"author":"a","authority":"b","session":"s","session_name":"n","account_sid":"AC1","keyword":"k","oauth":true}`)}); err != nil {
		t.Fatalf("look-alike keys refused: %v", err)
	}
	if after := b.count(t); after != before+1 {
		t.Fatalf("rows %d → %d after one accepted effect", before, after)
	}
}

// badMarshaler's MarshalJSON returns bytes that are not JSON.
type badMarshaler struct{}

func (badMarshaler) MarshalJSON() ([]byte, error) { return []byte("{nope"), nil }

func enqueueOne(b *bundle, e pgoutbox.Effect) (int64, error) {
	var id int64
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		id, err = pgoutbox.Enqueue(b.ctx, tx, e)
		return err
	})
	return id, err
}

func TestPayloadCheckConstraint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Plain SQL bypassing the Go check still hits the CHECK constraint.
	_, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload)
		VALUES ('q', 't', 'k', jsonb_build_object('s', repeat('x', 70000)))`)
	if err == nil || !strings.Contains(err.Error(), "effects_payload_size") {
		t.Fatalf("want effects_payload_size violation, got %v", err)
	}
	if n := b.count(t); n != 0 {
		t.Fatalf("%d rows, want 0", n)
	}
}

func TestIsCredentialKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]bool{
		"token": true, "access_token": true, "githubToken": true, "SECRET": true, "webhook-secret": true,
		"password": true, "private_key": true, "privateKey": true, "authorization": true, "api_key": true,
		"record_id": false, "title": false, "tokenizer_name": false, "keys": false, "sha": false, "author": false,
		// Issue 17, point 8: short and carrier names.
		"pwd": true, "db_pwd": true, "PWD": true, "passcode": true, "auth": true, "basic_auth": true, "authHeader": true,
		"X-Auth-Token": true, "bearer": true, "bearerValue": true, "jwt": true, "id_jwt": true, "JWTClaims": true,
		"dsn": true, "sentryDsn": true, "DATABASE_DSN": true, "cookies": true, "set_cookie": true, "privkey": true,
		"sessionid": true, "session_id": true, "sessionId": true, "SessionID": true, "PHPSESSID": true,
		"JSESSIONID": true, "sessid": true, "ASP.NET_SessionId": true, "connect.sid": true, "session_key": true,
		// ... and the common keys that must stay accepted.
		"authority": false, "authors": false, "author_association": false, "authenticated": false, "oauth": false,
		"session": false, "sessions": false, "session_name": false, "session_count": false, "sid": false,
		"account_sid": false, "password_hint_shown": true, "dsn_count": true, "keyword": false, "passage": false,
		"bypass": false, "compass": false, "jwt_issuer": true, "cookie_consent": true,
	} {
		if got := pgoutbox.IsCredentialKey(key); got != want {
			t.Errorf("IsCredentialKey(%q) = %v, want %v", key, got, want)
		}
	}
}
