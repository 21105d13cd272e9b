package ops_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// binDir holds the pgoutbox binary built once for the command tests.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgoutbox-ops-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	pgtest.Main(m, func() error {
		_ = os.RemoveAll(dir)
		return goleak.Find()
	})
}

var buildBinary = sync.OnceValues(func() (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(binDir, "pgoutbox")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/pgoutbox")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/pgoutbox: %v\n%s", err, out)
	}
	return bin, nil
})

// binary returns the path of the real pgoutbox binary, built on first use.
func binary(t *testing.T) string {
	t.Helper()
	bin, err := buildBinary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// bundle is what a test gets from setup: a migrated database of its own.
type bundle struct {
	pool *pgxpool.Pool
	dsn  string
	ctx  context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	db := pgtest.NewBundle(t, 2*time.Minute)
	pool, dsn, ctx := db.Pool, db.DSN, db.Ctx
	return &bundle{pool: pool, dsn: dsn, ctx: ctx}
}

// eff describes one effect to seed, relative to the database's now().
// Durations are how long ago something happened.
type eff struct {
	queue, typ, state string
	attempts          int
	maxAttempts       int     // 0: 8
	availableAgo      float64 // seconds; negative: in the future
	createdAgo        float64 // seconds; 0: availableAgo
	leasedAgo         float64 // leased: seconds since the claim
	started           bool    // delivery_started_at set
	completedAgo      float64 // completed: seconds since completion
	lastError         string
	payload           string // JSON; "": {}
	key               string // "": generated
}

var keySeq struct {
	sync.Mutex
	n int
}

const seedSQL = `
INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, payload, state, attempts, max_attempts,
    available_at, created_at, leased_at, lease_owner, lease_token, lease_expires_at, delivery_started_at,
    completed_at, dead_lettered_at, reconciliation_at, last_error)
SELECT $1, $2, $3, $4::jsonb, $5::pgoutbox.effect_state, $6, $7,
    now() - make_interval(secs => $8), now() - make_interval(secs => $9),
    CASE WHEN $5 IN ('leased', 'completed', 'reconciliation_required') THEN now() - make_interval(secs => $10) END,
    CASE WHEN $5 = 'leased' THEN 'seed-worker' END,
    CASE WHEN $5 = 'leased' THEN gen_random_uuid() END,
    CASE WHEN $5 = 'leased' THEN now() - make_interval(secs => $10) + interval '1 minute' END,
    CASE WHEN $11 THEN now() - make_interval(secs => $10) END,
    CASE WHEN $5 = 'completed' THEN now() - make_interval(secs => $12) END,
    CASE WHEN $5 = 'dead_letter' THEN now() - make_interval(secs => $12) END,
    CASE WHEN $5 = 'reconciliation_required' THEN now() END,
    nullif($13, '')
RETURNING id`

// seed inserts effects on db (a pool or a transaction) and returns their ids.
func seed(t *testing.T, ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, effs ...eff) []int64 {
	t.Helper()
	ids := make([]int64, len(effs))
	for i, e := range effs {
		if e.maxAttempts == 0 {
			e.maxAttempts = 8
		}
		if e.createdAgo == 0 {
			e.createdAgo = max(e.availableAgo, e.completedAgo, e.leasedAgo)
		}
		if e.payload == "" {
			e.payload = "{}"
		}
		if e.key == "" {
			keySeq.Lock()
			keySeq.n++
			e.key = fmt.Sprintf("seed-%d", keySeq.n)
			keySeq.Unlock()
		}
		err := db.QueryRow(ctx, seedSQL, e.queue, e.typ, e.key, e.payload, e.state, e.attempts, e.maxAttempts,
			e.availableAgo, e.createdAgo, e.leasedAgo, e.started, e.completedAgo, e.lastError).Scan(&ids[i])
		if err != nil {
			t.Fatalf("seed %+v: %v", e, err)
		}
	}
	return ids
}

// fingerprint is a digest of every row of the tables an operator command may
// touch, to prove a command changed nothing.
func (b *bundle) fingerprint(t *testing.T) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(b.ctx, `
		SELECT coalesce((SELECT md5(string_agg(to_jsonb(e)::text, ',' ORDER BY id)) FROM pgoutbox.effects e), '-')
		    || '/' || coalesce((SELECT md5(string_agg(to_jsonb(k)::text, ',' ORDER BY queue, idempotency_key)) FROM pgoutbox.effect_keys k), '-')
		    || '/' || coalesce((SELECT md5(string_agg(to_jsonb(s)::text, ',' ORDER BY sampled_at, queue, worker)) FROM pgoutbox.samples s), '-')
		    || '/' || (SELECT string_agg(table_schema || '.' || table_name, ',' ORDER BY 1) FROM information_schema.tables
		               WHERE table_schema NOT IN ('pg_catalog', 'information_schema'))`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *bundle) state(t *testing.T, id int64) string {
	t.Helper()
	var s string
	if err := b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, id).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func (b *bundle) rowJSON(t *testing.T, id int64) string {
	t.Helper()
	return pgtest.EffectJSON(t, b.ctx, b.pool, id)
}

// inTx runs fn in a transaction that is rolled back: everything fn seeds and
// reads shares one database clock (now() is the transaction's start).
func (b *bundle) inTx(t *testing.T, fn func(tx pgx.Tx)) {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	fn(tx)
}
