package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec))
	}
	pgtest.Main(m, func() error { return goleak.Find() })
}

// full reports whether the full sizes were asked for.
func full() bool {
	v, _ := strconv.ParseBool(os.Getenv("PGOUTBOX_RELIABILITY_FULL"))
	return v
}

// pick returns scaled, or fullSize under PGOUTBOX_RELIABILITY_FULL=1.
func pick[T any](scaled, fullSize T) T {
	if full() {
		return fullSize
	}
	return scaled
}

func long(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("reliability scenario; skipped with -short")
	}
}

// figures are one scenario's results, logged and (with
// PGOUTBOX_RELIABILITY_REPORT) appended to the report file.
type figures map[string]any

var reportMu sync.Mutex

func report(t *testing.T, scenario string, f figures) {
	t.Helper()
	f["scenario"] = scenario
	f["test"] = t.Name()
	f["full_size"] = full()
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURES %s", b)
	path := os.Getenv("PGOUTBOX_RELIABILITY_REPORT")
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

// The storage matrix (pgtest.StorageEnv, `make test-batch`): with
// PGOUTBOX_TEST_STORAGE=batch every queue that names no storage uses batch
// storage, in the tests' clients, in the worker processes (workerMain; they
// inherit the environment) and in `pgoutbox serve` (its queues' storage is
// recorded in the database before it starts). A scenario that checks the
// row storage itself pins pgoutbox.StorageRows and says why.

// testStorage is the storage the test matrix asks for ("" for the
// engine's default).
func testStorage() pgoutbox.Storage { return pgoutbox.Storage(pgtest.Storage()) }

// withTestStorage is queues with the test matrix's storage where none is
// set, and a batch queue with its lanes (pgtest.LanesEnv) where it sets
// none.
func withTestStorage(queues map[string]pgoutbox.QueueConfig) map[string]pgoutbox.QueueConfig {
	s := testStorage()
	if s == "" {
		return queues
	}
	out := make(map[string]pgoutbox.QueueConfig, len(queues))
	for name, q := range queues {
		if q.Storage == "" {
			q.Storage = s
		}
		if q.Storage == pgoutbox.StorageBatch && q.Lanes == 0 {
			q.Lanes = pgtest.Lanes()
		}
		out[name] = q
	}
	return out
}

// useTestStorage records the test matrix's storage for queues, before
// anything is enqueued to them: an effect enqueued to a queue whose
// storage no Client has recorded yet goes to the row storage.
func (d *db) useTestStorage(t *testing.T, ctx context.Context, queues ...string) {
	t.Helper()
	if s := testStorage(); s != "" {
		for _, q := range queues {
			d.setStorage(t, ctx, q, s)
		}
	}
}

// setStorage records queue's storage (pgoutbox.SetStorage).
func (d *db) setStorage(t *testing.T, ctx context.Context, queue string, s pgoutbox.Storage) {
	t.Helper()
	if err := pgoutbox.SetStorage(ctx, d.pool, queue, s); err != nil {
		t.Fatal(err)
	}
}

// checkStorage fails the test when the test matrix asks for batch storage
// and no effect went through pgoutbox.stream: the scenario would have run
// the row storage without saying so.
func (d *db) checkStorage(t *testing.T, ctx context.Context) {
	t.Helper()
	if testStorage() != pgoutbox.StorageBatch {
		return
	}
	if n := d.scalar(t, ctx, `SELECT count(*) FROM pgoutbox.stream`); n == 0 {
		t.Errorf("%s=%s, but no effect was enqueued to batch storage (pgoutbox.stream is empty)", pgtest.StorageEnv, testStorage())
	}
}

// db is one test's database.
type db struct {
	pool *pgxpool.Pool
	dsn  string
}

func newDB(t *testing.T) *db {
	t.Helper()
	pool, dsn := pgtest.NewPool(t)
	return &db{pool: pool, dsn: dsn}
}

// clusterDB is a database on a cluster the test controls.
func clusterDB(t *testing.T, cl *pgtest.Cluster) *db {
	t.Helper()
	dsn := cl.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &db{pool: pool, dsn: dsn}
}

func (d *db) scalar(t *testing.T, ctx context.Context, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// completedIDs is the set of effects completed now (either storage).
func (d *db) completedIDs(t *testing.T, ctx context.Context) map[int64]bool {
	t.Helper()
	rows, err := d.pool.Query(ctx, `SELECT id FROM pgoutbox.effect_states WHERE state = 'completed'`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	done := make(map[int64]bool, len(ids))
	for _, id := range ids {
		done[id] = true
	}
	return done
}

func (d *db) exec(t *testing.T, ctx context.Context, sql string, args ...any) {
	t.Helper()
	if _, err := d.pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// spec is what to enqueue: n effects of queue, every dispatchEvery-th (if
// > 0) of type "dispatch" (not replay-safe), the others "safe". storage,
// when set, is the queue's storage whatever the test matrix says.
type spec struct {
	queue         string
	n             int
	dispatchEvery int
	keyPrefix     string
	maxAttempts   int
	storage       pgoutbox.Storage
}

// enqueued maps the id of every enqueued effect to its type and key.
type enqueued map[int64]struct{ typ, key string }

// enqueue records the queue's storage (s.storage, else the test
// matrix's) and writes the effects in committed transactions of 5,000.
func (d *db) enqueue(t *testing.T, ctx context.Context, s spec) enqueued {
	t.Helper()
	if s.storage != "" {
		d.setStorage(t, ctx, s.queue, s.storage)
	} else {
		d.useTestStorage(t, ctx, s.queue)
	}
	out := enqueued{}
	const chunk = 5000
	for start := 0; start < s.n; start += chunk {
		var batch []pgoutbox.Effect
		for i := start; i < min(start+chunk, s.n); i++ {
			typ := typeSafe
			if s.dispatchEvery > 0 && i%s.dispatchEvery == s.dispatchEvery-1 {
				typ = typeDispatch
			}
			batch = append(batch, pgoutbox.Effect{
				Queue: s.queue, Type: typ, Key: fmt.Sprintf("%s%d", s.keyPrefix, i),
				Payload: map[string]any{"n": i}, MaxAttempts: s.maxAttempts,
			})
		}
		var ids []int64
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			var err error
			ids, err = pgoutbox.EnqueueBatch(ctx, tx, batch)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			out[id] = struct{ typ, key string }{batch[i].Type, batch[i].Key}
		}
	}
	return out
}

// waitFor polls cond every interval until it holds; it fails at ctx's end.
func waitFor(t *testing.T, ctx context.Context, what string, interval time.Duration, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// terminalSQL counts effects in a final or operator-visible state, in
// either storage.
const terminalSQL = `SELECT count(*) FROM pgoutbox.effect_states
	WHERE state IN ('completed', 'dead_letter', 'reconciliation_required')`

// timeout gives a scenario a deadline that is a safety net, never a
// synchronization.
func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// leaseModes are the two lease modes every delivery scenario runs in:
// durable leases, and row-lock leases (QueueConfig.RowLockLease) with a
// hold of 50 ms.
var leaseModes = []struct {
	name string
	hold time.Duration
}{{"durable", pgoutbox.RowLockLeaseOff}, {"rowlock", 50 * time.Millisecond}}

// eachMode runs fn once per lease mode, one after the other (the scenarios
// measure times on a small machine).
func eachMode(t *testing.T, fn func(t *testing.T, hold time.Duration)) {
	t.Helper()
	for _, m := range leaseModes {
		t.Run(m.name, func(t *testing.T) { fn(t, m.hold) })
	}
}

// modeName names the lease mode of a hold, for the figures.
func modeName(hold time.Duration) string {
	if hold > 0 {
		return "rowlock"
	}
	return "durable"
}
