package nats_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
	"github.com/pgoutbox/pgoutbox/adapters/nats/internal/handoff"
)

// The test binary doubles as a relay or consumer process: with childEnv
// set, TestMain runs childMain instead of the tests.
const (
	childEnv    = "PGOUTBOX_NATS_TEST_CHILD"
	childDSN    = "PGOUTBOX_NATS_TEST_DSN"
	childNATS   = "PGOUTBOX_NATS_TEST_URL"
	childTarget = "PGOUTBOX_NATS_TEST_TARGET"
	childArg    = "PGOUTBOX_NATS_TEST_ARG"
)

// Settings the parent and its children share.
const (
	killRelayBatch = 200
	childAckWait   = time.Second
)

// childMain is a relay or consumer process.
//
// Mode "relay" relays queue "q" in batches of killRelayBatch and prints
// "batch N" after the acks of each batch; on batch number childArg it prints
// "acked N" and hangs before handing the batch over, until it is killed.
//
// Mode "consume" consumes queue "q": the handlers of "safe" (replay-safe)
// and "dispatch" (not replay-safe) POST the key to the target URL, print
// "started <id> <type>" and hang until the process is killed.
func childMain() int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(childDSN))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	nc, err := natsgo.Connect(os.Getenv(childNATS))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	switch os.Getenv(childEnv) {
	case "relay":
		hangAt, _ := strconv.Atoi(os.Getenv(childArg))
		var batches atomic.Int64
		r, err := pgnats.NewRelay(pool, js, pgnats.RelayConfig{
			ID: "relay-child", Queues: []string{"q"}, Retry: testPolicy, Batch: killRelayBatch, Concurrency: 1,
			AfterPublish: func(acked int) {
				if batches.Add(1) == int64(hangAt) {
					fmt.Printf("acked %d\n", acked)
					select {} // until SIGKILL: published, not handed over
				}
				fmt.Printf("batch %d\n", acked)
			},
		})
		if err != nil {
			return fail(err)
		}
		if err := r.Start(ctx); err != nil {
			return fail(err)
		}
	case "consume":
		target := os.Getenv(childTarget)
		client := &http.Client{Timeout: 5 * time.Second}
		hang := func(_ context.Context, d *pgoutbox.Delivery) error {
			resp, err := client.Post(target+"/"+d.Key, "text/plain", nil)
			if err != nil {
				return pgoutbox.Retry(err)
			}
			resp.Body.Close()
			fmt.Printf("started %d %s\n", d.ID, d.Type)
			select {} // until SIGKILL: delivered, outcome never recorded
		}
		c, err := pgnats.NewConsumer(pool, js, pgnats.ConsumerConfig{
			ID: "consumer-child", Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 8, DeliveryTimeout: 500 * time.Millisecond}},
			Retry: testPolicy, AckWait: childAckWait,
			Types: []pgoutbox.EffectType{
				{Name: "safe", ReplaySafe: true, Handler: hang},
				{Name: "dispatch", Handler: hang},
			},
		})
		if err != nil {
			return fail(err)
		}
		if err := c.Start(ctx); err != nil {
			return fail(err)
		}
		fmt.Println("consuming")
	default:
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // run until killed or stdin closes
	return 0
}

type child struct {
	cmd    *exec.Cmd
	stdout *bufio.Scanner
}

func startChild(t interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // held open until the child is killed
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &child{cmd: cmd, stdout: bufio.NewScanner(out)}
}

// readUntil returns the first stdout line starting with prefix, or fails.
func (c *child) readUntil(t interface {
	Helper()
	Fatalf(string, ...any)
}, prefix string) string {
	t.Helper()
	for c.stdout.Scan() {
		if line := c.stdout.Text(); strings.HasPrefix(line, prefix) {
			return line
		}
	}
	t.Fatalf("child exited before printing %q: %v", prefix, c.stdout.Err())
	return ""
}

func TestRelayKilledMidBatchLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 2000
	effects := make([]pgoutbox.Effect, total)
	for i := range effects {
		effects[i] = pgoutbox.Effect{Queue: "q", Type: "noop", Key: pgoutbox.Key("noop", strconv.Itoa(i))}
	}
	ids := b.enqueue(t, effects...)
	if _, err := pgnats.EnsureStream(b.ctx, b.js, pgnats.Stream{}, testPolicy, []string{"q"}); err != nil {
		t.Fatal(err)
	}
	// The relay process hangs after the publishes of its third batch were
	// acknowledged, before the hand-over, and is killed there.
	c := startChild(t, childEnv+"=relay", childDSN+"="+b.dsn, childNATS+"="+b.url, childArg+"=3")
	if line := c.readUntil(t, "acked "); line != fmt.Sprintf("acked %d", killRelayBatch) {
		t.Fatalf("child: %q", line)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()

	// Mid-batch: one batch is in the stream but still leased by the dead
	// relay in PostgreSQL.
	var stranded []int64
	rows, err := b.pool.Query(b.ctx, `SELECT id FROM pgoutbox.effects WHERE state = 'leased' AND lease_owner = 'relay-child'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		stranded = append(stranded, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	handed := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE lease_owner = $1`, handoff.Owner)
	if msgs, _ := b.streamState(t, pgnats.StreamNameDefault); len(stranded) != killRelayBatch || handed != 2*killRelayBatch ||
		msgs != 3*killRelayBatch {
		t.Fatalf("at the kill: %d leased by the dead relay, %d handed over, %d messages; want %d, %d, %d",
			len(stranded), handed, msgs, killRelayBatch, 2*killRelayBatch, 3*killRelayBatch)
	}

	// The dead relay's lease runs out and the sweeper recovers the batch; a
	// restarted relay publishes it again (as duplicates) and the rest.
	b.expire(t, stranded...)
	if n := b.sweep(t); n != killRelayBatch {
		t.Fatalf("swept %d, want %d", n, killRelayBatch)
	}
	reg := prometheus.NewRegistry()
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: testPolicy, Batch: killRelayBatch, Registerer: reg})
	b.waitFor(t, "every effect handed over", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE lease_owner = $1`, handoff.Owner) == total
	})
	if msgs, last := b.streamState(t, pgnats.StreamNameDefault); msgs != total || last != total {
		t.Fatalf("stream holds %d messages (last sequence %d) for %d effects: lost or duplicated", msgs, last, total)
	}
	if dups := counter(t, reg, "pgoutbox_relay_duplicates_total"); dups != killRelayBatch {
		t.Fatalf("%v duplicate acks, want %d (the batch published before the kill)", dups, killRelayBatch)
	}
	// And every effect is delivered and completed.
	var delivered atomic.Int64
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 32}}, Retry: testPolicy, AckWait: time.Second,
		Types: []pgoutbox.EffectType{{Name: "noop", ReplaySafe: true, Handler: func(context.Context, *pgoutbox.Delivery) error {
			delivered.Add(1)
			return nil
		}}},
	})
	b.waitFor(t, "every effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND id = ANY($1)`, ids) == total
	})
	if n := delivered.Load(); n != total {
		t.Fatalf("%d deliveries for %d effects", n, total)
	}
}

// countingTarget is a fake target that counts the requests it saw per key.
type countingTarget struct {
	*httptest.Server
	calls calls
}

func newCountingTarget(t *testing.T) *countingTarget {
	ct := &countingTarget{}
	ct.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.URL.Path, "/")
		ct.calls.add(key)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(ct.Close)
	return ct
}

func TestConsumerKilledMidDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	target := newCountingTarget(t)
	ids := b.enqueue(t,
		pgoutbox.Effect{Queue: "q", Type: "dispatch", Key: "dispatch"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "a"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "b"},
		pgoutbox.Effect{Queue: "q", Type: "safe", Key: "c"},
	)
	b.startRelay(t, pgnats.RelayConfig{Queues: []string{"q"}, Retry: testPolicy})

	// The consumer process sends all four and is killed before it records
	// any outcome.
	c := startChild(t, childEnv+"=consume", childDSN+"="+b.dsn, childNATS+"="+b.url, childTarget+"="+target.URL)
	started := map[string]bool{}
	for len(started) < 4 {
		started[c.readUntil(t, "started ")] = true
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND lease_owner = 'consumer-child'`); n != 4 {
		t.Fatalf("%d effects leased by the dead consumer, want 4", n)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE delivery_started_at IS NOT NULL`); n != 1 {
		t.Fatalf("%d effects with delivery_started_at, want 1 (the dispatch)", n)
	}
	b.expire(t, ids...) // the dead consumer's leases run out

	// A new consumer gets the redeliveries (after the ack wait) with handlers
	// that send and succeed.
	send := func(ctx context.Context, d *pgoutbox.Delivery) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.URL+"/"+d.Key, nil)
		if err != nil {
			return err
		}
		resp, err := noKeepAlive.Do(req)
		if err != nil {
			return pgoutbox.Retry(err)
		}
		return resp.Body.Close()
	}
	b.startConsumer(t, pgnats.ConsumerConfig{
		Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 4, DeliveryTimeout: 500 * time.Millisecond}},
		Retry:  testPolicy, AckWait: childAckWait,
		Types: []pgoutbox.EffectType{
			{Name: "safe", ReplaySafe: true, Handler: send},
			{Name: "dispatch", Handler: send},
		},
	})
	b.waitFor(t, "every effect settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state IN ('completed', 'reconciliation_required')`) == 4
	})
	for _, key := range []string{"a", "b", "c"} {
		var state string
		var attempts int
		if err := b.pool.QueryRow(b.ctx, `SELECT state::text, attempts FROM pgoutbox.effects WHERE idempotency_key = $1`, key).
			Scan(&state, &attempts); err != nil {
			t.Fatal(err)
		}
		if state != "completed" || attempts != 2 || target.calls.get(key) != 2 {
			t.Errorf("replay-safe %s: %s after %d attempts, %d sends; want completed after 2 attempts, 2 sends",
				key, state, attempts, target.calls.get(key))
		}
	}
	var state string
	if err := b.pool.QueryRow(b.ctx, `SELECT state::text FROM pgoutbox.effects WHERE id = $1`, ids[0]).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if state != "reconciliation_required" || target.calls.get("dispatch") != 1 {
		t.Fatalf("dispatch: %s after %d sends; want reconciliation_required after exactly 1", state, target.calls.get("dispatch"))
	}
	// Every message was settled: the dispatch's terminated, never redelivered.
	b.waitFor(t, "the stream to be drained", func() bool {
		msgs, _ := b.streamState(t, pgnats.StreamNameDefault)
		return msgs == 0
	})
	if target.calls.get("dispatch") != 1 {
		t.Fatal("the dispatch was sent again")
	}
}

var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
