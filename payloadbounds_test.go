package pgoutbox_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox"
)

// nested returns depth objects nested in each other under the key name,
// around the value 1: {"keyx":{"keyx":…1…}}.
func nested(name string, depth int) string {
	return strings.Repeat(`{"`+name+`":`, depth) + "1" + strings.Repeat("}", depth)
}

// boundsCases are payloads that cost the server more than their size
// (issue 27, point 6) and the reason each is refused for, next to the
// largest shapes that pass.
var boundsCases = []struct {
	name, payload, reason string // reason "": accepted
}{
	{"deep harmless keys", nested("keyx", 5000), "nests deeper than 64 levels of arrays and objects"},
	{"one level too deep", strings.Repeat("[", 65) + strings.Repeat("]", 65), "nests deeper than 64 levels of arrays and objects"},
	{"deep inside a string is text", `{"s": "` + strings.Repeat("[", 100) + `"}`, ""},
	{"at the depth limit", nested("keyx", 64), ""},
	{"exponent 131071", `{"n": 1e131071}`, "has a number with an exponent beyond ±400"},
	{"negative exponent", `[1E-131071]`, "has a number with an exponent beyond ±400"},
	{"exponent 401", `[1e+401]`, "has a number with an exponent beyond ±400"},
	{"exponent 400 with zeros", `[1e000400, 5e-324, 1.7976931348623157e308]`, ""},
	{"101-digit number", `[` + strings.Repeat("9", 101) + `]`, "has a number literal longer than 100 characters"},
	{"100-digit number", `[` + strings.Repeat("9", 100) + `]`, ""},
	{"number before a credential key", `{"a": 1e999, "password": 1}`, "has a number with an exponent beyond ±400"},
}

// Every entry point refuses the same payloads with the same reason, before
// they are parsed into jsonb: Go's Enqueue (an InvalidEffectError on
// Payload), pgoutbox.enqueue and pgoutbox.enqueue_batch (OB001 on
// payload), and nothing is written.
func TestPayloadBoundsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grantEnqueue(t, "pgoutbox_enqueuer", "bounds", "")
	for i, tc := range boundsCases {
		t.Run(tc.name, func(t *testing.T) {
			key := fmt.Sprintf("k%d", i)
			var goErr error
			_ = pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				_, goErr = pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "bounds", Type: "t", Key: "go-" + key,
					Payload: []byte(tc.payload)})
				return errors.New("roll back")
			})
			sqlErr := b.execAs("pgoutbox_enqueuer", `SELECT pgoutbox.enqueue('bounds', 't', $1, $2::text::json)`, "sql-"+key, tc.payload)
			batchErr := b.execAs("pgoutbox_enqueuer", `SELECT * FROM pgoutbox.enqueue_batch(json_build_array(json_build_object(
				'queue', 'bounds', 'effect_type', 't', 'idempotency_key', $1::text, 'payload', $2::text::json)))`, "batch-"+key, tc.payload)
			if tc.reason == "" {
				for what, err := range map[string]error{"Go": goErr, "SQL": sqlErr, "batch": batchErr} {
					if err != nil {
						t.Errorf("%s refused a payload within the bounds: %v", what, err)
					}
				}
				return
			}
			var ie *pgoutbox.InvalidEffectError
			if !errors.As(goErr, &ie) || ie.Field != "Payload" || ie.Reason != tc.reason {
				t.Errorf("Go: %v, want an InvalidEffectError on Payload: %s", goErr, tc.reason)
			}
			for what, err := range map[string]error{"SQL": sqlErr, "batch": batchErr} {
				var pe *pgconn.PgError
				want := "pgoutbox: invalid effect: payload " + tc.reason
				if !errors.As(err, &pe) || pe.Code != "OB001" || pe.ColumnName != "payload" || pe.Message != want {
					t.Errorf("%s: %v, want OB001 on payload: %s", what, err, want)
				}
			}
		})
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE idempotency_key NOT LIKE 'go-%'`); n != 2*int64(countAccepted()) {
		t.Fatalf("%d effects written through SQL, want the %d accepted payloads twice", n, countAccepted())
	}
}

func countAccepted() int {
	n := 0
	for _, tc := range boundsCases {
		if tc.reason == "" {
			n++
		}
	}
	return n
}

// A batch's max_attempts number is bounded before it is read as numeric.
func TestSQLBatchMaxAttemptsNumberBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grantEnqueue(t, "pgoutbox_enqueuer", "bounds", "")
	err := b.execAs("pgoutbox_enqueuer", `SELECT * FROM pgoutbox.enqueue_batch('[{"queue": "bounds", "effect_type": "t",
		"idempotency_key": "k", "max_attempts": 1e131071}]')`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "OB001" || pe.ColumnName != "max_attempts" {
		t.Fatalf("max_attempts 1e131071: %v, want OB001 on max_attempts", err)
	}
}

// A payload within the bounds whose stored (jsonb) text is over the limit
// is refused with its size, not "-1 bytes" (issue 27, point 6), and
// nothing is written: in a row queue (effects_payload_size) and in a batch
// queue, whose stream keeps the text as given (json, migration 00036) but
// bounds it as jsonb writes it (stream_payload_size).
func TestEnqueueStoredSizeErrorSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := pgoutbox.SetStorage(b.ctx, b.pool, "batched", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	payload := "[" + strings.TrimSuffix(strings.Repeat("1e99,", 2000), ",") + "]" // 10 KB given, 200 KB stored
	for _, queue := range []string{"q", "batched"} {
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: queue, Type: "t", Key: "k", Payload: []byte(payload)})
			return err
		})
		var pe *pgoutbox.PayloadTooLargeError
		if !errors.As(err, &pe) || pe.Size != len(payload) || !pe.Stored || strings.Contains(err.Error(), "-1") {
			t.Fatalf("%s: stored size over the limit: %v (%+v), want a PayloadTooLargeError with the given size, as stored",
				queue, err, pe)
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("%d bytes", len(payload))) || !strings.Contains(msg, "as stored") {
			t.Fatalf("%s: message %q: want the size given and that the stored form is over the limit", queue, msg)
		}
		if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states WHERE queue = $1`, queue); n != 0 {
			t.Fatalf("%s: the refused effect left %d rows", queue, n)
		}
	}
}
