package reliability

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgoutbox/pgoutbox"
)

// TestExtendAndGroupCommitDoNotDeadlock is the regression test of a
// deadlock scenario 5 found: the lease extender's UPDATE (store.Extend, every
// in-flight lease of the client, in Go map order) and the group committer's
// UPDATE (store.Complete, a batch in arrival order) locked overlapping rows
// in different orders, and PostgreSQL aborted one of them with 40P01. An
// aborted completion left the delivered effect leased until it expired: a
// replay-safe effect was delivered again, a non-replay-safe one went to
// reconciliation_required although its delivery had succeeded. Fixed in
// 3b3d0a7 (fenced multi-row statements lock rows in id order).
//
// The client here makes the overlap frequent (64 deliveries in flight, a
// short lease so the extender runs every 400 ms); the test fails on any
// deadlock, recovered lease or duplicate delivery under a live worker.
func TestExtendAndGroupCommitDoNotDeadlock(t *testing.T) {
	long(t)
	eachMode(t, testExtendAndGroupCommit)
}

func testExtendAndGroupCommit(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 4*time.Minute)
	d := newDB(t)
	const n = 6000
	want := d.enqueue(t, ctx, spec{queue: "q", n: n, dispatchEvery: 4, keyPrefix: "k"})
	var mu sync.Mutex
	calls := map[int64]int{}
	handler := func(ctx context.Context, dl *pgoutbox.Delivery) error {
		mu.Lock()
		calls[dl.ID]++
		mu.Unlock()
		timer := time.NewTimer(time.Duration(rand.IntN(30)) * time.Millisecond)
		defer timer.Stop()
		select {
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	client, err := pgoutbox.NewClient(d.pool, pgoutbox.Config{
		Queues:        withTestStorage(map[string]pgoutbox.QueueConfig{"q": {Concurrency: 64, DeliveryTimeout: time.Second, RowLockLease: hold}}),
		Types:         []pgoutbox.EffectType{{Name: typeSafe, ReplaySafe: true, Handler: handler}, {Name: typeDispatch, Handler: handler}},
		Logger:        slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registerer:    reg,
		LeaseDuration: 1200 * time.Millisecond,
		SweepInterval: 200 * time.Millisecond,
		PollInterval:  50 * time.Millisecond,
		PruneInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "every effect final", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, terminalSQL) == n
	})
	drain := time.Since(t0)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	var cl []call
	mu.Lock()
	for id, k := range calls {
		for range k {
			cl = append(cl, call{id: id})
		}
	}
	mu.Unlock()
	l := account(t, ctx, d, want, cl, 0)
	text := logs.String()
	deadlocks := strings.Count(text, "deadlock detected")
	rescued := 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "pgoutbox_rescued_total" {
			for _, m := range mf.GetMetric() {
				rescued += m.GetCounter().GetValue()
			}
		}
	}
	if deadlocks > 0 || rescued > 0 || l.SafeDuplicates > 0 || l.States["reconciliation_required"] > 0 {
		var lines []string
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, "deadlock") {
				lines = append(lines, line)
			}
		}
		t.Errorf("under one live worker: %d log lines with deadlock detected (40P01), %v leases recovered by the sweeper, %d replay-safe duplicates, "+
			"%d delivered dispatches in reconciliation_required; want 0 each:\n%s",
			deadlocks, rescued, l.SafeDuplicates, l.States["reconciliation_required"], strings.Join(lines[:min(6, len(lines))], "\n"))
	}
	if l.Lost != 0 || l.DispatchDuplicate != 0 {
		t.Errorf("ledger: %+v", l.figures())
	}
	f := l.figures()
	f["deadlock_log_lines"] = deadlocks
	f["leases_recovered_by_sweeper"] = rescued
	f["drain_s"] = round(drain.Seconds())
	f["lease_mode"] = modeName(hold)
	report(t, "extender vs group commit (deadlock regression)", f)
}
