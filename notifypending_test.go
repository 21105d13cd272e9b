package pgoutbox_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// TestPruneDropsNotifyPendingOfGoneBackends checks that Prune deletes the
// notify_pending row (migration 00011) of a backend that has exited and
// keeps the rows of live backends: one idle, one inside a transaction that
// has marked its row and not committed yet, whose NOTIFY must still fire.
func TestPruneDropsNotifyPendingOfGoneBackends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	connect := func() (*pgx.Conn, int64) {
		t.Helper()
		conn, err := pgx.Connect(b.ctx, b.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(b.ctx) })
		enqueueOn(t, b, conn, "setup-"+strconv.Itoa(int(conn.PgConn().PID())))
		return conn, int64(conn.PgConn().PID())
	}
	_, gonePID := connect()
	_, idlePID := connect()
	open, openPID := connect()

	// The open transaction rewrites its backend's row and stays open.
	tx, err := open.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "np", Type: "t", Key: "open"}); err != nil {
		t.Fatal(err)
	}

	// With a timeout, pg_terminate_backend returns once the process has
	// exited, which clears its pg_stat_activity entry.
	var exited bool
	if err := b.pool.QueryRow(b.ctx, `SELECT pg_terminate_backend($1::int, 60000)`, gonePID).Scan(&exited); err != nil || !exited {
		t.Fatalf("terminate %d: %v %v", gonePID, exited, err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1::int`, gonePID); n != 0 {
		t.Fatalf("backend %d still live", gonePID)
	}

	rowsOf := func(pid int64) int64 {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.notify_pending WHERE pid = $1::int`, pid)
	}
	before := b.scalar(t, `SELECT count(*) FROM pgoutbox.notify_pending`)
	for _, pid := range []int64{gonePID, idlePID, openPID} {
		if rowsOf(pid) != 1 {
			t.Fatalf("no notify_pending row for backend %d before Prune", pid)
		}
	}
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Prune(b.ctx); err != nil {
		t.Fatal(err)
	}
	after := b.scalar(t, `SELECT count(*) FROM pgoutbox.notify_pending`)
	if rowsOf(gonePID) != 0 {
		t.Fatalf("row of exited backend %d kept (rows %d → %d)", gonePID, before, after)
	}
	if rowsOf(idlePID) != 1 || rowsOf(openPID) != 1 {
		t.Fatalf("row of a live backend deleted (rows %d → %d)", before, after)
	}
	if after != before-1 {
		t.Fatalf("rows %d → %d, want one fewer", before, after)
	}

	// The open transaction's commit still notifies.
	listener, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(b.ctx)
	if _, err := listener.Exec(b.ctx, `LISTEN pgoutbox_effects`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM pgoutbox.notify_state`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	n, err := listener.WaitForNotification(b.ctx)
	if err != nil || n.Payload != "np" {
		t.Fatalf("notification %+v (%v), want one for queue np", n, err)
	}
}

// enqueueOn commits one effect of queue np on conn.
func enqueueOn(t *testing.T, b *bundle, conn *pgx.Conn, key string) {
	t.Helper()
	err := pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error {
		_, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "np", Type: "t", Key: key})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
