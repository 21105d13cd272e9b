package controlplane_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// TestLifecycleJobRefusesAnAppliedInboxRow: a control_plane.webhook job
// naming an inbox row that was already applied (here a check_run
// rerequested, which would dispatch the release again) changes nothing,
// dispatches nothing and dead-letters with the reason.
func TestLifecycleJobRefusesAnAppliedInboxRow(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	snap := b.pushRelease(t, emu, "refs/tags/v1.0.0")
	d, err := emu.RerequestCheckRun(b.ctx, snap.CheckRuns[0].ID)
	must(t, err)
	b.inboxOutcome(t, d.ID)
	b.waitEmu(t, emu, "second dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 2 })
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	inbox := b.scalar(t, `SELECT id FROM control_plane.webhook_inbox WHERE delivery_id = $1`, d.ID)
	digest := func() string {
		var s string
		must(t, b.pool.QueryRow(b.ctx, `SELECT md5(coalesce((SELECT string_agg(to_jsonb(w)::text, ',' ORDER BY id) FROM control_plane.webhook_inbox w), '')
			|| coalesce((SELECT string_agg(to_jsonb(a)::text, ',' ORDER BY id) FROM control_plane.execution_attempts a), '')
			|| coalesce((SELECT string_agg(to_jsonb(r)::text, ',' ORDER BY id) FROM control_plane.release_runs r), '')
			|| (SELECT count(*) FROM pgoutbox.effects WHERE queue = $1)::text)`, controlplane.QueueOutbox).Scan(&s))
		return s
	}
	before := digest()

	var job int64
	must(t, pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		job, err = pgoutbox.Enqueue(b.ctx, tx, pgoutbox.Effect{Queue: controlplane.QueueJobs, Type: controlplane.TypeWebhook,
			Key: "again", Payload: map[string]any{"inbox_id": inbox}})
		return err
	}))
	b.waitFor(t, "the job finished", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state IN ('completed', 'dead_letter')`, job) == 1
	})
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := len(emu.Dispatches()); n != 2 {
		t.Fatalf("%d dispatches after a job replayed an applied inbox row, want 2", n)
	}
	if after := digest(); after != before {
		t.Fatal("a job naming an applied inbox row changed the control plane's state")
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE id = $1 AND state = 'dead_letter'
		AND last_error LIKE '%not waiting to be applied%'`, job); n != 1 {
		t.Fatal("the refused job is not a dead letter that says why")
	}
}
