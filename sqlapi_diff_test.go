package pgoutbox

// The SQL API (migration 00008) against Go's Enqueue: the same inputs get the
// same verdict. These tests are in package pgoutbox to reach the fuzz seeds
// and the classifier's internals; the TestMain of package pgoutbox_test
// (main_test.go) provides the PostgreSQL server.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// SQL API error codes (migration 00008, docs/any-language.md).
const (
	sqlInvalidEffect   = "OB001"
	sqlPayloadTooLarge = "OB002"
	sqlCredentialKey   = "OB003"
)

func diffPool(tb testing.TB) (*pgxpool.Pool, context.Context) {
	tb.Helper()
	pool, _ := pgtest.NewPool(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	tb.Cleanup(cancel)
	return pool, ctx
}

// pgCode is the SQLSTATE of err, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

func pgMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	return ""
}

// inSavepoint runs fn in a savepoint of tx that is always rolled back, so a
// failing statement does not abort tx and nothing fn writes survives.
func inSavepoint(ctx context.Context, tx pgx.Tx, fn func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = sp.Rollback(ctx) }()
	return fn(sp)
}

// storedPayload enqueues through fn and returns the stored payload's text.
func storedPayload(ctx context.Context, tx pgx.Tx, enqueue func(pgx.Tx) (int64, error)) (string, error) {
	var stored string
	err := inSavepoint(ctx, tx, func(sp pgx.Tx) error {
		id, err := enqueue(sp)
		if err != nil {
			return err
		}
		return sp.QueryRow(ctx, `SELECT payload::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&stored)
	})
	return stored, err
}

// comparePayloadVerdicts runs Go's Enqueue and pgoutbox.enqueue on raw and
// fails t unless they agree: both accept and store the same payload, or both
// refuse with the matching reason.
func comparePayloadVerdicts(ctx context.Context, t *testing.T, tx pgx.Tx, raw []byte) {
	t.Helper()
	goStored, goErr := storedPayload(ctx, tx, func(sp pgx.Tx) (int64, error) {
		return Enqueue(ctx, sp, Effect{Queue: "q", Type: "t", Key: "go", Payload: json.RawMessage(raw)})
	})
	sqlStored, sqlErr := storedPayload(ctx, tx, func(sp pgx.Tx) (int64, error) {
		var id int64
		err := sp.QueryRow(ctx, `SELECT pgoutbox.enqueue('q', 't', 'sql', $1::text::json)`, string(raw)).Scan(&id)
		return id, err
	})
	show := string(raw)
	if len(show) > 300 {
		show = show[:300] + "…"
	}
	code := pgCode(sqlErr)
	switch {
	case goErr == nil && sqlErr == nil:
		if goStored != sqlStored {
			t.Fatalf("payload %q stored differently:\nGo:  %s\nSQL: %s", show, goStored, sqlStored)
		}
		return
	case goErr == nil || sqlErr == nil:
		t.Fatalf("payload %q: Go says %v, SQL says %v", show, goErr, sqlErr)
	}
	// Both refused. A payload PostgreSQL's json input or jsonb cannot hold
	// (not UTF-8, \u0000, a lone surrogate in a key) is refused by the
	// database for Go too; whichever reason comes first is fine, as long as
	// the database indeed cannot store it.
	if !strings.HasPrefix(code, "OB") {
		if strings.HasPrefix(code, "22") || code == "54001" {
			if err := inSavepoint(ctx, tx, func(sp pgx.Tx) error {
				_, err := sp.Exec(ctx, `SELECT $1::text::jsonb`, string(raw))
				return err
			}); err == nil && errors.Is(goErr, ErrCredentialKey) {
				t.Fatalf("payload %q: Go refuses a credential key (%v), SQL refuses it with %v, yet jsonb accepts it", show, goErr, sqlErr)
			}
			var ie *InvalidEffectError
			if errors.As(goErr, &ie) || errors.Is(goErr, ErrPayloadTooLarge) || errors.Is(goErr, ErrCredentialKey) || pgCode(goErr) != "" {
				return
			}
		}
		t.Fatalf("payload %q: Go refuses with %v, SQL with unexpected %v", show, goErr, sqlErr)
	}
	var ce *CredentialKeyError
	var pe *PayloadTooLargeError
	var ie *InvalidEffectError
	switch {
	case errors.As(goErr, &ce):
		if code != sqlCredentialKey || pgMessage(sqlErr) != ce.Error() {
			t.Fatalf("payload %q: Go refuses %q, SQL refuses %s %q", show, ce.Error(), code, pgMessage(sqlErr))
		}
	case errors.As(goErr, &pe):
		if code != sqlPayloadTooLarge || (!pe.Stored && pgMessage(sqlErr) != pe.Error()) {
			t.Fatalf("payload %q: Go refuses %q, SQL refuses %s %q", show, pe.Error(), code, pgMessage(sqlErr))
		}
	case errors.As(goErr, &ie) && ie.Field == "Payload":
		// The bounds (depth, numbers): one reason, one message.
		if want := "pgoutbox: invalid effect: payload " + ie.Reason; code != "OB001" || pgMessage(sqlErr) != want {
			t.Fatalf("payload %q: Go refuses %q, SQL refuses %s %q", show, ie.Error(), code, pgMessage(sqlErr))
		}
	default:
		t.Fatalf("payload %q: Go refuses with %v, SQL with %s %q", show, goErr, code, pgMessage(sqlErr))
	}
}

// FuzzSQLCredentialGuard is the differential test of the payload rules: the
// same payload through Go's Enqueue and through pgoutbox.enqueue is stored
// identically by both or refused by both for the same reason (the credential
// key's path, the payload's size). Without -fuzz it runs the seed corpus:
// FuzzPayloadCredentialGuard's seeds, every GitHub webhook payload of
// testdata/github-webhooks, and payloads around the size bound.
func FuzzSQLCredentialGuard(f *testing.F) {
	for _, s := range credentialGuardSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"a":{"secret":2},"a":1}`, `{"a\u0000":1}`, `{"token":1,"a\u0000":1}`, `{"a":"\ud800"}`,
		`{"\ud800":1}`, `{"to\u006ben":1}`, `{"x":{"\u212Aey":1,"api\u212Aey":2}}`, `{"APIKey":{"y":1}}`,
		`[` + strings.Repeat(`[`, 2000) + `{"n":{"passwd":1}}` + strings.Repeat(`]`, 2000) + `]`,
		`{"a":1e400}`, `{"a":1e401}`, `{"n":1e131071}`, `[1E-0400,` + strings.Repeat("1", 101) + `]`,
		strings.Repeat(`{"keyx":`, 5000) + "1" + strings.Repeat("}", 5000),
		strings.Repeat(`{"keyx":`, 63) + `{"token":1}` + strings.Repeat("}", 63),
		strings.Repeat(`[`, 60) + `{"a":{"b":[1,{"token":1}]}}` + strings.Repeat(`]`, 60),
		`{"İd":1,"prİvate_key":2}`, "{\"a\u00a0token\":1}", `{"tokenÄ":1}`, `{"tokenä":1}`,
	} {
		f.Add([]byte(s))
	}
	pad := func(n int) []byte { return []byte(`{"a":"` + strings.Repeat("x", n-8) + `"}`) }
	f.Add(pad(MaxPayloadBytes))
	f.Add(pad(MaxPayloadBytes + 1))
	// 65,536 bytes as given, longer as jsonb stores it (": " for ":").
	f.Add([]byte(`[` + strings.Repeat(`{"a":1},`, (MaxPayloadBytes-2)/8) + `{}]`))
	seedWebhookPayloads(f, MaxPayloadBytes)
	pool, ctx := diffPool(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		comparePayloadVerdicts(ctx, t, tx, raw)
	})
}

// FuzzSQLIsCredentialKey: pgoutbox.is_credential_key and IsCredentialKey
// agree on every key PostgreSQL can hold (valid UTF-8 without NUL).
func FuzzSQLIsCredentialKey(f *testing.F) {
	for _, s := range credentialKeySeeds {
		f.Add(s)
	}
	for _, s := range []string{"tokenÄ", "tokenä", "ÄToken", "äToken", "中Token", "Token中", "İd", "prİvate_key",
		"api\u212Aey", "x\u00a0token", "X\u0301Token", "ǅToken", "tokenǅ", "٣token", "ⅫToken", "a_b-c.d", "ApiKEY", "APIkey"} {
		f.Add(s)
	}
	pool, ctx := diffPool(f)
	f.Fuzz(func(t *testing.T, key string) {
		if !utf8.ValidString(key) || strings.ContainsRune(key, 0) {
			return // PostgreSQL's text cannot hold it
		}
		var got bool
		if err := pool.QueryRow(ctx, `SELECT pgoutbox.is_credential_key($1)`, key).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := IsCredentialKey(key); got != want {
			t.Fatalf("key %q: SQL says %v, Go says %v", key, got, want)
		}
	})
}

// runeClass is splitWords' view of a rune, as scripts/gen-key-rune-classes
// writes it into pgoutbox.key_rune_classes.
func runeClass(r rune) byte {
	switch {
	case !unicode.IsLetter(r) && !unicode.IsDigit(r):
		return 'S'
	case unicode.IsUpper(r):
		return 'U'
	case unicode.IsLower(r):
		return 'L'
	}
	return 'O'
}

type runeRange struct {
	Lo, Hi int32
	Class  byte
}

func goRuneRanges() []runeRange {
	var out []runeRange
	lo, prev := rune(0), runeClass(0)
	for r := rune(1); r <= unicode.MaxRune+1; r++ {
		c := byte('S')
		if r <= unicode.MaxRune {
			c = runeClass(r)
		}
		if c == prev {
			continue
		}
		if prev != 'S' {
			out = append(out, runeRange{lo, r - 1, prev})
		}
		lo, prev = r, c
	}
	return out
}

// TestKeyRuneClassesMatchGo: the table the SQL guard splits words by holds
// exactly the classes of Go's unicode package of this toolchain. When a Go
// release moves to a new Unicode version this fails, and a migration must
// replace the rows (go run ./scripts/gen-key-rune-classes).
func TestKeyRuneClassesMatchGo(t *testing.T) {
	t.Parallel()
	pool, ctx := diffPool(t)
	rows, err := pool.Query(ctx, `SELECT lo, hi, class::text FROM pgoutbox.key_rune_classes ORDER BY lo`)
	if err != nil {
		t.Fatal(err)
	}
	var got []runeRange
	var r runeRange
	var class string
	if _, err := pgx.ForEachRow(rows, []any{&r.Lo, &r.Hi, &class}, func() error {
		got = append(got, runeRange{r.Lo, r.Hi, class[0]})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := goRuneRanges()
	if !slices.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("pgoutbox.key_rune_classes has %d ranges, Go's unicode %s has %d; first difference at range %d "+
			"(regenerate with go run ./scripts/gen-key-rune-classes into a new migration)", len(got), unicode.Version, len(want), i)
	}
}

// TestSQLIsCredentialKeyAtEveryClassBoundary checks the SQL classifier
// against Go's on keys that put the code points at either side of every
// class range boundary before, inside and after credential words, where a
// wrong class changes the word split.
func TestSQLIsCredentialKeyAtEveryClassBoundary(t *testing.T) {
	t.Parallel()
	pool, ctx := diffPool(t)
	var keys []string
	add := func(c rune) {
		if c <= 0 || c > unicode.MaxRune || !utf8.ValidRune(c) {
			return
		}
		s := string(c)
		keys = append(keys, "token"+s, s+"Token", "api"+s+"Key", "A"+s+"Token", "x"+s+"token", s)
	}
	for _, r := range goRuneRanges() {
		add(r.Lo - 1)
		add(r.Lo)
		add(r.Hi)
		add(r.Hi + 1)
	}
	var got []bool
	if err := pool.QueryRow(ctx, `SELECT array_agg(pgoutbox.is_credential_key(k) ORDER BY o) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, o)`,
		keys).Scan(&got); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, k := range keys {
		if want := IsCredentialKey(k); got[i] != want {
			bad++
			if bad <= 10 {
				t.Errorf("key %q (%U): SQL says %v, Go says %v", k, []rune(k), got[i], want)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d keys disagree", bad, len(keys))
	}
	t.Logf("%d keys agree", len(keys))
}

// TestSQLIsCredentialKeyOnWebhookKeys: every object key of the GitHub webhook
// corpus gets the same verdict from SQL and Go, in one statement.
func TestSQLIsCredentialKeyOnWebhookKeys(t *testing.T) {
	t.Parallel()
	pool, ctx := diffPool(t)
	files, err := filepath.Glob("testdata/github-webhooks/*/*.json")
	if err != nil || len(files) < 100 {
		t.Fatalf("webhook corpus: %d files (%v)", len(files), err)
	}
	seen := map[string]bool{}
	var collect func(v any)
	collect = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				seen[k] = true
				collect(x)
			}
		case []any:
			for _, x := range v {
				collect(x)
			}
		}
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		collect(v)
	}
	var keys []string
	for k := range seen {
		// And the key in the other spellings the guard must see through.
		keys = append(keys, k, strings.ToUpper(k), strings.ReplaceAll(k, "_", "-"), "x"+k, k+"Token")
	}
	var got []bool
	if err := pool.QueryRow(ctx, `SELECT array_agg(pgoutbox.is_credential_key(k) ORDER BY o) FROM unnest($1::text[]) WITH ORDINALITY AS u(k, o)`,
		keys).Scan(&got); err != nil {
		t.Fatal(err)
	}
	creds := 0
	for i, k := range keys {
		want := IsCredentialKey(k)
		if got[i] != want {
			t.Errorf("key %q: SQL says %v, Go says %v", k, got[i], want)
		}
		if want {
			creds++
		}
	}
	if creds == 0 || creds == len(keys) {
		t.Fatalf("%d of %d keys are credential keys: the corpus does not exercise both verdicts", creds, len(keys))
	}
	t.Logf("%d distinct keys, %d spellings, %d credential keys; SQL and Go agree", len(seen), len(keys), creds)
}

// TestSQLFieldRulesMatchGo: queue, effect_type, idempotency_key,
// max_attempts and delay (alone and with available_at) at and around their
// bounds, white space of every kind Go's
// TrimSpace removes included: pgoutbox.enqueue refuses (OB001, writing
// nothing) exactly what Go's Enqueue refuses.
func TestSQLFieldRulesMatchGo(t *testing.T) {
	t.Parallel()
	pool, ctx := diffPool(t)
	var spaces []string
	for r := rune(1); r <= unicode.MaxRune; r++ {
		if unicode.IsSpace(r) {
			spaces = append(spaces, string(r))
		}
	}
	spaces = append(spaces, "\u200b", "\u180e", "\ufeff", "\u001c") // not white space to Go
	texts := []string{"", "a", strings.Repeat("é", 64), strings.Repeat("é", 65), strings.Repeat("x", 128),
		strings.Repeat("x", 129), strings.Repeat("x", 512), strings.Repeat("x", 513), " a ", strings.Join(spaces[:6], "")}
	for _, s := range spaces {
		texts = append(texts, s, s+s, s+"a")
	}
	type tc struct {
		e     Effect
		field string
	}
	var cases []tc
	for _, s := range texts {
		cases = append(cases,
			tc{Effect{Queue: s, Type: "t", Key: "k"}, "queue"},
			tc{Effect{Queue: "q", Type: s, Key: "k"}, "effect_type"},
			tc{Effect{Queue: "q", Type: "t", Key: s}, "idempotency_key"},
			tc{Effect{Queue: "q", Type: "t", Key: "k", OrderingKey: s}, "ordering_key"})
	}
	for _, n := range []int{-1, 0, 1, 8, 1000, 1001} {
		cases = append(cases, tc{Effect{Queue: "q", Type: "t", Key: "k", MaxAttempts: n}, "max_attempts"})
	}
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, d := range []time.Duration{-time.Second, -time.Microsecond, 0, time.Microsecond, time.Hour} {
		cases = append(cases, tc{Effect{Queue: "q", Type: "t", Key: "k", Delay: d}, "delay"},
			tc{Effect{Queue: "q", Type: "t", Key: "k", Delay: d, AvailableAt: at}, "delay"})
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, c := range cases {
		goErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error {
			_, err := Enqueue(ctx, sp, c.e)
			return err
		})
		var n int64
		sqlErr := inSavepoint(ctx, tx, func(sp pgx.Tx) error {
			var avail *time.Time
			if !c.e.AvailableAt.IsZero() {
				avail = &c.e.AvailableAt
			}
			var okey *string // Go's "" (no ordering key) is SQL's NULL
			if c.e.OrderingKey != "" {
				okey = &c.e.OrderingKey
			}
			if _, err := sp.Exec(ctx, `SELECT pgoutbox.enqueue($1, $2, $3, NULL, $4, $5, $6, $7)`,
				c.e.Queue, c.e.Type, c.e.Key, c.e.MaxAttempts, avail, c.e.Delay, okey); err != nil {
				return err
			}
			return sp.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&n)
		})
		var ie *InvalidEffectError
		switch {
		case goErr == nil && sqlErr == nil:
			if n != 1 {
				t.Fatalf("%+v: %d rows after the SQL enqueue, want 1", c.e, n)
			}
		case errors.As(goErr, &ie):
			var pe *pgconn.PgError
			if !errors.As(sqlErr, &pe) || pe.Code != sqlInvalidEffect || pe.ColumnName != c.field {
				t.Fatalf("%+v: Go refuses (%v), SQL says %v", c.e, goErr, sqlErr)
			}
		default:
			t.Fatalf("%+v: Go says %v, SQL says %v", c.e, goErr, sqlErr)
		}
	}
	var effects int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects`).Scan(&effects); err != nil || effects != 0 {
		t.Fatalf("%d effects left after rolled-back savepoints (%v)", effects, err)
	}
	t.Logf("%d cases agree", len(cases))
}

// TestSQLKeyMatchesGo: pgoutbox.key is Key.
func TestSQLKeyMatchesGo(t *testing.T) {
	t.Parallel()
	pool, ctx := diffPool(t)
	for _, parts := range [][]string{{}, {""}, {"record.upsert", "r1", "abc"}, {"a|b", "c"}, {"a", "b|c"}, {"ünï", "中文", "🙂"}} {
		var got string
		if err := pool.QueryRow(ctx, `SELECT pgoutbox.key(VARIADIC $1::text[])`, parts).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := Key(parts...); got != want {
			t.Fatalf("key(%q) = %s, Go's Key = %s", parts, got, want)
		}
	}
	_, err := pool.Exec(ctx, `SELECT pgoutbox.key('a', NULL)`)
	if pgCode(err) != sqlInvalidEffect {
		t.Fatalf("key with a NULL part: %v, want %s", err, sqlInvalidEffect)
	}
}

func ExampleKey_sql() {
	fmt.Println(Key("record.upsert", "r1", "abc"))
	// Output: 2a5a1e8b2700f55097b2719c36cf6821768cac8601913fa1cebddbefdb0968ee
}

// BenchmarkEnqueueGoAndSQL measures one enqueue inside an open transaction
// through Go's Enqueue and through pgoutbox.enqueue, with a small payload
// and with a GitHub push webhook (7.5 KB, many keys holding a credential
// stem such as "key" or "token"), each with its database round trip.
func BenchmarkEnqueueGoAndSQL(b *testing.B) {
	pool, ctx := diffPool(b)
	push, err := os.ReadFile("testdata/github-webhooks/push/payload.json")
	if err != nil {
		b.Fatal(err)
	}
	payloads := map[string][]byte{"small": []byte(`{"record_id":"r1","version":3,"source_hash":"6dcb09b5b57875f334f61aebed695e2e4193db5e"}`)}
	payloads["webhook"] = push
	for _, name := range []string{"small", "webhook"} {
		raw := payloads[name]
		for _, side := range []string{"go", "sql"} {
			b.Run(side+"/"+name, func(b *testing.B) {
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = tx.Rollback(ctx) }()
				i := 0
				for b.Loop() {
					i++
					k := fmt.Sprintf("%s-%d", side, i)
					if side == "go" {
						_, err = Enqueue(ctx, tx, Effect{Queue: "q", Type: "t", Key: k, Payload: json.RawMessage(raw)})
					} else {
						_, err = tx.Exec(ctx, `SELECT pgoutbox.enqueue('q', 't', $1, $2::text::json)`, k, string(raw))
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// guardPayloads are the shapes of issue 27, point 6: 5,000 objects nested
// under a harmless key holding a credential stem (44 KB: refused by the
// depth bound since 00015), and the costliest shape within the bounds, 64
// levels each with 80 such keys (62 KB).
func guardPayloads() map[string][]byte {
	var wide strings.Builder
	for d := 0; d < 64; d++ { // MaxPayloadDepth
		wide.WriteString("{")
		for k := 0; k < 80; k++ {
			fmt.Fprintf(&wide, `"keyx%d":1,`, k)
		}
		wide.WriteString(`"keyx":`)
	}
	wide.WriteString("1" + strings.Repeat("}", 64))
	return map[string][]byte{
		"deep5000": []byte(strings.Repeat(`{"keyx":`, 5000) + "1" + strings.Repeat("}", 5000)),
		"wide64":   []byte(wide.String()),
	}
}

// BenchmarkPayloadGuardDeep measures the payload guard on guardPayloads:
// Go's (encodePayload, no database) and the SQL API's (pgoutbox.enqueue in
// a savepoint, round trip included), whether it accepts or refuses.
//
//	go test -run '^$' -bench BenchmarkPayloadGuardDeep -benchtime 3x .
func BenchmarkPayloadGuardDeep(b *testing.B) {
	pool, ctx := diffPool(b)
	payloads := guardPayloads()
	for _, name := range []string{"deep5000", "wide64"} {
		raw := payloads[name]
		b.Run("go/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				_, _ = encodePayload(json.RawMessage(raw))
			}
		})
		b.Run("sql/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			tx, err := pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			for b.Loop() {
				_ = inSavepoint(ctx, tx, func(sp pgx.Tx) error {
					_, err := sp.Exec(ctx, `SELECT pgoutbox.enqueue('q', 't', 'bench', $1::text::json)`, string(raw))
					return err
				})
			}
		})
	}
}
