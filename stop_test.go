package pgoutbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func isClaim(sql string) bool {
	return strings.Contains(sql, "FOR UPDATE SKIP LOCKED") && strings.Contains(sql, "state = 'available'")
}

// A statement of the client's own loops in flight when Stop begins is not
// cut short: cut short, pgx closes its connection in the background (a
// cancel request, then Terminate), so the statement went on running on the
// server after Stop returned: a claim transaction (row-lock mode) stayed
// open ("1 claim transactions left open after Stop"), a durable claim could
// commit leases no one delivers until they expire, and a heartbeat or
// maintenance statement showed as "1 transactions open after Stop". Each
// case holds one statement (a pgtest.Gate on the client's pool) until Stop
// has begun (the client's listener, which exits only when Stop cancels the
// run context, disconnected), then checks it was sent under a live
// context. The maintenance case holds the first statement of the sweeper's
// parking pass at Start; the next-due case the query an idle claim loop
// sends after an empty claim (poll.go).
func TestStopLetsAStatementInFlightFinish(t *testing.T) {
	t.Parallel()
	isUnpark := func(sql string) bool {
		return strings.Contains(sql, "SET available_at = e.parked_due_at, parked_due_at = NULL")
	}
	isNextDue := func(sql string) bool { return strings.Contains(sql, "extract(epoch FROM e.available_at - now())") }
	cases := []struct {
		name        string
		hold        time.Duration // RowLockLease
		match       func(sql string) bool
		armAtStart  bool
		description string
	}{
		{"claim/" + leaseModes[0].name, leaseModes[0].hold, isClaim, false, "the claim"},
		{"claim/" + leaseModes[1].name, leaseModes[1].hold, isClaim, false, "the claim"},
		{"maintenance", pgoutbox.RowLockLeaseOff, isUnpark, true, "the sweeper's unpark"},
		{"next due", pgoutbox.RowLockLeaseOff, isNextDue, false, "the next-due query"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			g := pgtest.NewGate(tc.match)
			c, err := pgoutbox.NewClient(g.Pool(t, b.dsn), pgoutbox.Config{
				Queues:       map[string]pgoutbox.QueueConfig{"q": {RowLockLease: tc.hold}},
				Types:        []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: noop}},
				PollInterval: 20 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.armAtStart {
				g.Arm()
			}
			if err := c.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			b.waitFor(t, "listener connected", func() bool { return listenerCount(t, b) == 1 })
			if !tc.armAtStart {
				g.Arm()
			}
			select {
			case <-g.Held():
			case <-b.ctx.Done():
				t.Fatalf("%s was not sent", tc.description)
			}
			sctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
			defer cancel()
			stopped := make(chan error, 1)
			go func() { stopped <- c.Stop(sctx) }()
			b.waitFor(t, "the listener gone (Stop began)", func() bool { return listenerCount(t, b) == 0 })
			g.Release()
			if err := <-stopped; err != nil {
				t.Fatal(err)
			}
			<-g.Done()
			if g.Ended() {
				t.Errorf("%s in flight when Stop began was sent under a context Stop had cancelled", tc.description)
			}
			if open := openTransactions(t, b); len(open) != 0 {
				t.Errorf("%d transactions open after Stop:\n%s", len(open), strings.Join(open, "\n"))
			}
		})
	}
}

// openTransactions describes the sessions of b's database, other than the
// one asking, that are in a transaction (a statement running counts).
func openTransactions(t *testing.T, b *bundle) []string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT format('pid %s (%s, application %L): %s, wait %s/%s, xid %s, for %s: %s',
			pid, backend_type, application_name, state, wait_event_type, wait_event, backend_xid,
			clock_timestamp() - xact_start, left(query, 200))
		FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	open, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return open
}
