package pgoutbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
)

// A producer that runs its constraints immediately (SET CONSTRAINTS ALL
// IMMEDIATE, before or after its enqueue) fires the limiter's commit-time
// trigger while its transaction stays open. Another producer's commit is
// still notified while it is open, and its own commit notifies too; set
// before its enqueue, the open producer holds no limiter row at all.
// Before migration 00017 the open producer held the queue's notifier lock
// to its end and the other producer skipped its notification.
func TestNotifyImmediateConstraintsDoNotSilenceOthers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, before, after string }{
		{"set before the enqueue", "SET CONSTRAINTS ALL IMMEDIATE", ""},
		{"set after the enqueue", "", "SET CONSTRAINTS ALL IMMEDIATE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			listener := listen(t, b)
			// The queue was notified an hour ago: the limiter has its row.
			if _, err := b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.notify_state (queue, notified_at)
				VALUES ('qa', now() - interval '1 hour')`); err != nil {
				t.Fatal(err)
			}
			open, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = open.Rollback(context.Background()) }()
			for _, sql := range []string{tc.before, "enqueue", tc.after} {
				switch sql {
				case "":
				case "enqueue":
					if _, err := pgoutbox.Enqueue(b.ctx, open, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "open"}); err != nil {
						t.Fatal(err)
					}
				default:
					if _, err := open.Exec(b.ctx, sql); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tc.before != "" {
				// Fired at the insert, the trigger took nothing.
				if n := b.scalar(t, `SELECT count(*) FROM (SELECT 1 FROM pgoutbox.notify_state
					WHERE queue = 'qa' FOR UPDATE SKIP LOCKED) l`); n != 1 {
					t.Fatal("the open producer holds the queue's limiter row")
				}
			}
			b.enqueue(t, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "committed"})
			if counts := notifications(t, b, listener, "qc"); counts["qa"] != 1 {
				t.Fatalf("%d notifications for qa from the committed producer while an immediate-constraints producer is open, want 1", counts["qa"])
			}
			if _, err := open.Exec(b.ctx, `SELECT 1`); err != nil {
				t.Fatalf("the open producer: %v", err)
			}
			if err := open.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			if counts := notifications(t, b, listener, "qd"); counts["qa"] != 1 {
				t.Fatalf("%d notifications for qa from the immediate-constraints producer's commit, want 1", counts["qa"])
			}
		})
	}
}

// The notifier and ordering locks are not advisory locks any more: a
// pgoutbox_enqueuer session holding, at session level, the advisory locks
// the engine used (the queue's notifier lock, the ordering key's stripe)
// neither blocks an ordered enqueue nor silences its notification. The
// role cannot take the engine's locks either: it may not lock their table
// rows, nor call the ordering lock directly.
func TestForeignAdvisoryLocksNeitherBlockNorSilence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listener := listen(t, b)
	squatter, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Close(context.Background())
	if _, err := squatter.Exec(b.ctx, `SET ROLE pgoutbox_enqueuer`); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`SELECT pg_advisory_lock(hashtextextended('pgoutbox.notify.qa', 0))`,
		`SELECT pg_advisory_lock(hashtext('pgoutbox.ordering:qa'), (hashtextextended('k', 0) & 255)::integer)`,
	} {
		if _, err := squatter.Exec(b.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	refused := func(conn *pgx.Conn, role, sql string) {
		t.Helper()
		err := pgx.BeginFunc(b.ctx, conn, func(tx pgx.Tx) error { _, err := tx.Exec(b.ctx, sql); return err })
		if pgCode(err) != "42501" {
			t.Errorf("as %s, %s: %v, want insufficient_privilege (42501)", role, sql, err)
		}
	}
	for _, sql := range []string{
		`SELECT 1 FROM pgoutbox.notify_state FOR UPDATE`,
		`SELECT 1 FROM pgoutbox.notify_pending FOR UPDATE`,
		`SELECT 1 FROM pgoutbox.ordering_stripes FOR UPDATE`,
		`SELECT 1 FROM pgoutbox.lock_claims FOR UPDATE`,
	} {
		refused(squatter, "pgoutbox_enqueuer", sql)
	}
	// A role that may not enqueue (here one that may read everything) may
	// not take ordering locks; one that may takes them with its enqueues
	// anyway, for its transaction only.
	const outsider = "pg_read_all_data"
	outside, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer outside.Close(context.Background())
	if _, err := outside.Exec(b.ctx, `SET ROLE `+outsider); err != nil {
		t.Fatal(err)
	}
	refused(outside, outsider, `SELECT pgoutbox.ordering_lock('{qa}', '{k}')`)

	// An ordered enqueue, on a connection of its own so that the test can
	// see whether it waits for a lock.
	producer, err := pgx.Connect(b.ctx, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close(context.Background())
	pid := producer.PgConn().PID()
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(b.ctx, producer, func(tx pgx.Tx) error {
			_, err := pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: "qa", Type: "t", Key: "a", OrderingKey: "k"})
			return err
		})
	}()
	var enqueueErr error
	finished := false
	b.waitFor(t, "the ordered enqueue committed or waits for a lock", func() bool {
		select {
		case enqueueErr = <-done:
			finished = true
			return true
		default:
		}
		return b.scalar(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) > 0
	})
	if !finished {
		t.Fatal("the ordered enqueue waits for a lock a pgoutbox_enqueuer session holds")
	}
	if enqueueErr != nil {
		t.Fatal(enqueueErr)
	}
	if counts := notifications(t, b, listener, "qc"); counts["qa"] != 1 {
		t.Fatalf("%d notifications for qa while a pgoutbox_enqueuer session holds the old notifier lock, want 1", counts["qa"])
	}
}
