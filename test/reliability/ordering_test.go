package reliability

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// orderedPayload is what the ordering scenario enqueues.
type orderedPayload struct {
	OKey  string `json:"okey"`
	Tag   string `json:"tag"`
	Flaky bool   `json:"flaky,omitempty"`
}

// orderedCall is the ordered target (workerSpec.OrderLog): one line per
// call start (S) and per success (E), each one write(2) to an O_APPEND
// file, stamped with the wall clock that every process of the machine
// shares. A flaky effect's first attempt fails after its S line.
func orderedCall(log *os.File, d *pgoutbox.Delivery, kind byte) error {
	var p orderedPayload
	if err := json.Unmarshal(d.Payload, &p); err != nil || p.OKey == "" {
		return nil
	}
	if kind == 'E' && p.Flaky && d.Attempt == 1 {
		return pgoutbox.Retry(errors.New("flaky target: first attempt refused"))
	}
	line := fmt.Sprintf("%c %s %s %d\n", kind, p.Tag, p.OKey, time.Now().UnixNano())
	if _, err := log.Write([]byte(line)); err != nil {
		return pgoutbox.Retry(err)
	}
	return nil
}

// Scenario: per-key ordering under faults, in both lease modes. Producers
// enqueue to many ordering keys in concurrent transactions (a transaction
// may draw its ids and then wait while others commit), worker processes
// are SIGKILLed and restarted, PostgreSQL is restarted in immediate mode,
// some deliveries fail once (a retry). A checker reads the target's log
// and proves, for every key, against the order in which the producers'
// transactions committed: no overtaking (no call of an effect before the
// previous effect's successful call), no gap, nothing lost.
func TestOrderedDeliveryUnderFaults(t *testing.T) {
	long(t)
	eachMode(t, testOrderedDeliveryUnderFaults)
}

func testOrderedDeliveryUnderFaults(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 8*time.Minute)
	cl := pgtest.NewCluster(t)
	d := clusterDB(t, cl)
	keys, producers, perProducer, kills := pick(60, 1000), 8, pick(150, 1500), pick(6, 20)
	const lease = 3 * time.Second
	dir := t.TempDir()
	orderLog := filepath.Join(dir, "target.log")

	seq := 0
	start := func() *worker {
		seq++
		owner := fmt.Sprintf("w%02d", seq)
		return startWorker(t, ctx, workerSpec{
			DSN: d.dsn, Owner: owner, Queue: "q", Concurrency: 8,
			Lease: lease, Sweep: 250 * time.Millisecond, Poll: 200 * time.Millisecond, Timeout: 2 * time.Second,
			BackoffCap: 300 * time.Millisecond, Latency: 2 * time.Millisecond, RowLock: hold,
			CallLog: filepath.Join(dir, owner+".calls"), LogFile: filepath.Join(dir, owner+".log"), OrderLog: orderLog,
		})
	}
	workers := []*worker{start(), start()}
	t0 := time.Now()

	// The producers. committed[key] is the key's effects in the order their
	// transactions committed: a transaction commits while holding the Go
	// mutexes of its keys (taken in key order), and appends its tags there,
	// so concurrent commits to one key are ordered, and the order is
	// recorded, exactly. The enqueue itself runs without them: two
	// transactions may draw ids in one order and commit in the other.
	var (
		mu        sync.Mutex
		committed = map[string][]string{}
		keyMu     = make([]sync.Mutex, keys)
		total     int
		producing sync.WaitGroup
		prodErr   = make(chan error, producers)
	)
	keyName := func(k int) string { return fmt.Sprintf("key-%04d", k) }
	for p := range producers {
		producing.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for i := 0; i < perProducer; {
				// One to three effects per transaction, on distinct keys,
				// in key order (the ordering locks' order, so no deadlock).
				var ks []int
				for range min(1+rng.IntN(3), perProducer-i) {
					// A quarter go to key 0: a hot key whose backlog the
					// sweepers park (docs/ordering.md, "Parking").
					k := rng.IntN(keys)
					if rng.IntN(4) == 0 {
						k = 0
					}
					if !slices.Contains(ks, k) {
						ks = append(ks, k)
					}
				}
				slices.Sort(ks)
				batch := make([]pgoutbox.Effect, len(ks))
				tags := make([]string, len(ks))
				for j, k := range ks {
					tags[j] = fmt.Sprintf("p%d-%d", p, i+j)
					raw, _ := json.Marshal(orderedPayload{OKey: keyName(k), Tag: tags[j], Flaky: rng.IntN(10) == 0})
					batch[j] = pgoutbox.Effect{Queue: "q", Type: typeSafe, Key: tags[j], Payload: json.RawMessage(raw),
						OrderingKey: keyName(k), MaxAttempts: 1000}
				}
				tx, err := d.pool.Begin(ctx)
				if err != nil {
					prodErr <- err
					return
				}
				if _, err := pgoutbox.EnqueueBatch(ctx, tx, batch); err != nil {
					_ = tx.Rollback(ctx)
					prodErr <- err
					return
				}
				for _, k := range ks {
					keyMu[k].Lock()
				}
				err = tx.Commit(ctx)
				if err == nil {
					mu.Lock()
					for j, k := range ks {
						committed[keyName(k)] = append(committed[keyName(k)], tags[j])
					}
					total += len(ks)
					mu.Unlock()
				}
				for _, k := range ks {
					keyMu[k].Unlock()
				}
				if err != nil {
					prodErr <- err
					return
				}
				i += len(ks)
			}
		})
	}

	// The deterministic interleaving: tx1 draws an id on key A and stays
	// open; tx2, on another key, draws a later id and commits first (ids
	// out of commit order across keys: allowed); tx3, on key A, waits for
	// tx1's ordering lock (seen in pg_locks) until tx1 commits.
	heldKey, otherKey := "held-A", "held-B"
	enq := func(tx pgx.Tx, okey, tag string) int64 {
		raw, _ := json.Marshal(orderedPayload{OKey: okey, Tag: tag})
		id, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "q", Type: typeSafe, Key: tag, Payload: json.RawMessage(raw), OrderingKey: okey})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	tx1, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id1 := enq(tx1, heldKey, "held-1")
	tx2, err := d.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id2 := enq(tx2, otherKey, "held-2")
	if err := tx2.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx3done := make(chan int64, 1)
	go func() {
		tx3, err := d.pool.Begin(ctx)
		if err != nil {
			t.Error(err)
			tx3done <- 0
			return
		}
		id := enq(tx3, heldKey, "held-3")
		if err := tx3.Commit(ctx); err != nil {
			t.Error(err)
		}
		tx3done <- id
	}()
	// Without the ordering lock tx3 would commit at once, before tx1: then
	// that is the commit order the checker holds the delivery to.
	var id3 int64
	tx3First := false
	waitFor(t, ctx, "tx3 waiting for the ordering lock of "+heldKey, 5*time.Millisecond, func() bool {
		select {
		case id3 = <-tx3done:
			tx3First = true
			return true
		default:
		}
		return d.scalar(t, ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`) > 0
	})
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	heldOrder := []string{"held-3", "held-1"}
	if !tx3First {
		id3 = <-tx3done
		heldOrder = []string{"held-1", "held-3"}
	}
	if !(id1 < id2 && id2 < id3) {
		t.Errorf("ids %d, %d, %d: want tx1 < tx2 < tx3", id1, id2, id3)
	}
	mu.Lock()
	committed[heldKey] = heldOrder
	committed[otherKey] = []string{"held-2"}
	total += 3
	mu.Unlock()

	// Faults while the producers run and while the queue drains: a kill of
	// one worker process (replaced at once) every few hundred completions,
	// and one immediate restart of PostgreSQL once the producers are done.
	done := func() int64 {
		var n int64 // -1 while the pool reconnects after the restart
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effect_states WHERE state = 'completed'`).Scan(&n); err != nil {
			return -1
		}
		return n
	}
	want := int64(producers*perProducer + 3)
	for k := 1; k <= kills; k++ {
		target := int64(k) * want / int64(kills+2)
		waitFor(t, ctx, fmt.Sprintf("%d effects completed before kill %d", target, k), 20*time.Millisecond, func() bool {
			return done() >= target
		})
		victim := k % 2
		workers[victim].kill(t)
		workers[victim] = start()
		if k == kills/2 {
			producing.Wait()
			select {
			case err := <-prodErr:
				t.Fatalf("producer: %v", err)
			default:
			}
			if _, err := cl.Restart(ctx, pgtest.StopImmediate); err != nil {
				t.Fatalf("restart: %v\n%s", err, tail(cl.LogFile(), 20))
			}
		}
	}
	producing.Wait()
	close(prodErr)
	for err := range prodErr {
		t.Fatalf("producer: %v", err)
	}
	if int64(total) != want {
		t.Fatalf("%d effects committed, want %d", total, want)
	}
	waitFor(t, ctx, "every effect completed", 50*time.Millisecond, func() bool { return done() == want })
	drain := time.Since(t0)
	for _, w := range workers {
		w.stop(t, ctx)
	}
	d.checkStorage(t, ctx)
	// In batch storage too: a page runs only the first effect of a key
	// (docs/batch-storage.md), so a consumer that dies before its page
	// settles repeats only the key's head.
	f := checkOrder(t, orderLog, committed)
	f["mode"], f["keys"], f["effects"], f["kills"], f["pg_restarts"] = modeName(hold), keys+2, want, kills, 1
	f["drain_s"] = round(drain.Seconds())
	report(t, "per-key ordering under faults", f)
}

// checkOrder reads the ordered target's log and proves, for every key,
// against committed (each key's tags in commit order):
//   - no overtaking: a call of the key's n-th effect starts only after the
//     (n-1)-th effect's successful call was recorded; a call may repeat
//     (at-least-once) only for the key's current or last completed
//     effect, never for an earlier one;
//   - no gap and nothing lost: every effect's call succeeded, in order.
func checkOrder(t *testing.T, path string, committed map[string][]string) figures {
	t.Helper()
	type event struct {
		kind byte
		tag  string
		key  string
		ns   int64
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var events []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.Fields(sc.Text())
		if len(parts) != 4 {
			t.Fatalf("torn line in the target's log: %q", sc.Text())
		}
		ns, err := strconv.ParseInt(parts[3], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, event{parts[0][0], parts[1], parts[2], ns})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].ns < events[j].ns })
	pos := map[string]int{} // tag → its place in its key's commit order
	for _, tags := range committed {
		for i, tag := range tags {
			pos[tag] = i
		}
	}
	next := map[string]int{} // key → how many of its effects succeeded, in order
	var overtakes, repeats, calls int
	var first []string
	fail := func(format string, args ...any) {
		overtakes++
		if len(first) < 10 {
			first = append(first, fmt.Sprintf(format, args...))
		}
	}
	for _, e := range events {
		p, ok := pos[e.tag]
		if !ok {
			fail("call of %s, which no producer committed", e.tag)
			continue
		}
		n := next[e.key]
		switch {
		case e.kind == 'S':
			calls++
			if p > n {
				fail("key %s: %s (#%d in commit order) called before #%d (%s) succeeded", e.key, e.tag, p, n, committed[e.key][n])
			} else if p < n-1 {
				fail("key %s: %s (#%d) called again after #%d succeeded", e.key, e.tag, p, n-1)
			} else if p == n-1 {
				repeats++
			}
		case p == n:
			next[e.key] = n + 1
		case p == n-1:
			repeats++ // a second success of a duplicate call
		default:
			fail("key %s: %s (#%d) succeeded while #%d was next", e.key, e.tag, p, n)
		}
	}
	lost := 0
	for key, tags := range committed {
		if next[key] != len(tags) {
			lost += len(tags) - next[key]
			if len(first) < 10 {
				first = append(first, fmt.Sprintf("key %s: %d of %d effects delivered in order", key, next[key], len(tags)))
			}
		}
	}
	if overtakes > 0 || lost > 0 {
		t.Errorf("%d overtakes, %d effects lost or out of order; first:\n%s", overtakes, lost, strings.Join(first, "\n"))
	}
	return figures{"calls": calls, "overtakes": overtakes, "lost": lost, "repeats": repeats}
}
