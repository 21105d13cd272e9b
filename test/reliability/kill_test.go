package reliability

import (
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
)

// Scenario 1: SIGKILL a worker process again and again while effects drain,
// in both lease modes.
// 0 lost; duplicates only for replay-safe effects, and only for effects the
// killed process held at the moment it died; every started dispatch in
// reconciliation_required with at most one target call (exactly one unless
// the kill fell between the committed delivery start and the call); the
// time from each kill until its leases are recovered is reported.
func TestSIGKILLWorkersDuringDrain(t *testing.T) {
	long(t)
	eachMode(t, testSIGKILLWorkers)
}

func testSIGKILLWorkers(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 8*time.Minute)
	d := newDB(t)
	total, kills := pick(10_000, 10_000), pick(20, 20)
	const lease = 3 * time.Second
	want := d.enqueue(t, ctx, spec{queue: "q", n: total, dispatchEvery: 10, keyPrefix: "k"})
	dir := t.TempDir()
	batch := testStorage() == pgoutbox.StorageBatch

	seq := 0
	start := func() *worker {
		seq++
		owner := fmt.Sprintf("w%02d", seq)
		return startWorker(t, ctx, workerSpec{
			DSN: d.dsn, Owner: owner, Queue: "q", Concurrency: 8,
			Lease: lease, Sweep: 250 * time.Millisecond, Poll: 200 * time.Millisecond, Timeout: 2 * time.Second,
			BackoffCap: 500 * time.Millisecond, Latency: 5 * time.Millisecond, RowLock: hold,
			CallLog: filepath.Join(dir, owner+".calls"), LogFile: filepath.Join(dir, owner+".log"),
		})
	}
	t0 := time.Now()
	workers := []*worker{start(), start()}

	type killRecord struct {
		owner    string
		inFlight []int64
		reclaim  time.Duration
	}
	var (
		mu       sync.Mutex
		records  []*killRecord
		inFlight = map[int64]bool{}
		wg       sync.WaitGroup
	)
	for k := 1; k <= kills; k++ {
		target := int64(k * total / (kills + 1))
		waitFor(t, ctx, fmt.Sprintf("%d effects done before kill %d", target, k), 20*time.Millisecond, func() bool {
			return d.scalar(t, ctx, terminalSQL) >= target
		})
		victim := workers[k%2]
		// Under row-lock leases the surviving worker may lock, deliver and
		// complete the dead process's rows before the query below reads
		// them (its locks die with it), so that query alone can miss an
		// effect the victim called and never completed. In batch storage
		// the victim's batch lease covers a page it delivered, which has
		// no row to read. What the victim called (its own call log, final
		// once it is dead) and was not completed just before the kill was
		// in flight in it too.
		fromLog := hold > 0 || batch
		var completedBefore map[int64]bool
		if fromLog {
			completedBefore = d.completedIDs(t, ctx)
		}
		victim.kill(t)
		killedAt := time.Now()
		// What the dead process held: its leases, read after it died, and
		// under row-lock leases the rows of its open batches, which are
		// available and carry its lock in xmax (a superset: the other
		// worker's open batches and rows locked by earlier claimers that
		// never wrote them count too).
		rows, err := d.pool.Query(ctx, `SELECT id FROM pgoutbox.effects
			WHERE (state = 'leased' AND lease_owner = $1) OR ($2 AND state = 'available' AND xmax <> '0'::xid)`,
			victim.spec.Owner, hold > 0)
		if err != nil {
			t.Fatal(err)
		}
		var held []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			held = append(held, id)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if fromLog {
			for _, c := range callsIn(t, victim.spec.CallLog) {
				if !completedBefore[c.id] {
					held = append(held, c.id)
				}
			}
		}
		rec := &killRecord{owner: victim.spec.Owner, inFlight: held}
		mu.Lock()
		records = append(records, rec)
		for _, id := range held {
			inFlight[id] = true
		}
		mu.Unlock()
		// Kill → reclaim: until no row, and no open batch, is leased by
		// the dead owner.
		wg.Go(func() {
			tick := time.NewTicker(25 * time.Millisecond)
			defer tick.Stop()
			for {
				var n int64
				err := d.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgoutbox.effects WHERE state = 'leased' AND lease_owner = $1)
					+ (SELECT count(*) FROM pgoutbox.stream_batches WHERE done_at IS NULL AND lease_owner = $1)`, rec.owner).Scan(&n)
				if err == nil && n == 0 {
					mu.Lock()
					rec.reclaim = time.Since(killedAt)
					mu.Unlock()
					return
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		})
		workers[k%2] = start()
	}
	waitFor(t, ctx, "every effect final", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, terminalSQL) == int64(total)
	})
	drain := time.Since(t0)
	wg.Wait()
	for _, w := range workers {
		w.stop(t, ctx)
	}

	calls, torn := readCalls(t, dir)
	l := account(t, ctx, d, want, calls, torn)
	l.check(t)
	// A duplicate is allowed only for an effect a killed process held.
	var outside []int64
	for _, id := range l.dupIDs {
		if !inFlight[id] {
			outside = append(outside, id)
		}
	}
	if len(outside) > 0 {
		t.Errorf("%d effects were delivered more than once without having been in flight in a killed worker: %v", len(outside), outside[:min(10, len(outside))])
	}
	// Reconciliation only for dispatches a killed process held.
	notHeld := 0
	for id, st := range l.stateByID {
		if st == "reconciliation_required" && !inFlight[id] {
			notHeld++
		}
	}
	if notHeld > 0 {
		t.Errorf("%d effects in reconciliation_required that no killed worker held", notHeld)
	}
	if l.States["dead_letter"] != 0 {
		t.Errorf("%d dead letters; no effect should exhaust its attempts", l.States["dead_letter"])
	}
	var reclaims []time.Duration
	held := 0
	for _, r := range records {
		if r.reclaim == 0 {
			t.Errorf("the leases of killed worker %s were never recovered", r.owner)
			continue
		}
		if len(r.inFlight) > 0 {
			reclaims = append(reclaims, r.reclaim)
		}
		held += len(r.inFlight)
	}
	if l.SafeDuplicates > held {
		t.Errorf("%d replay-safe duplicates, more than the %d effects in flight at the kills", l.SafeDuplicates, held)
	}
	slices.Sort(reclaims)
	f := l.figures()
	f["kills"] = kills
	f["in_flight_at_kills"] = held
	f["lease_s"] = lease.Seconds()
	f["drain_s"] = round(drain.Seconds())
	if len(reclaims) > 0 {
		f["kill_to_reclaim_p50_s"] = round(reclaims[len(reclaims)/2].Seconds())
		f["kill_to_reclaim_max_s"] = round(reclaims[len(reclaims)-1].Seconds())
		f["kill_to_reclaim_min_s"] = round(reclaims[0].Seconds())
	}
	f["lease_mode"] = modeName(hold)
	report(t, "1 SIGKILL workers", f)
}

func round(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }
