package controlplane_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
)

// TestReplayedWebhookBodyDispatchesNothing: a captured, validly signed
// `check_run rerequested` body posted again under new delivery ids (and
// under another event name, which the signature does not cover) is
// answered 202 and writes nothing: no inbox row, no job, no dispatch. GitHub's
// own redelivery (same id, same body) keeps answering 200.
func TestReplayedWebhookBodyDispatchesNothing(t *testing.T) {
	t.Parallel()
	b, emu := installed(t, fakegh.Options{})
	snap := b.pushRelease(t, emu, "refs/tags/v1.0.0")
	// Re-run once the first dispatch's answer is persisted.
	b.waitDispatched(t, snap.Dispatches[0].RunID)
	rerun, err := emu.RerequestCheckRun(b.ctx, snap.CheckRuns[0].ID)
	must(t, err)
	if rerun.StatusCode != http.StatusAccepted {
		t.Fatalf("the real rerequest: %d, want 202", rerun.StatusCode)
	}
	b.waitEmu(t, emu, "second dispatch", func(s fakegh.Snapshot) bool { return len(s.Dispatches) == 2 })
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })

	before := b.counts(t)
	sig := map[string]string{"X-Hub-Signature-256": rerun.Header.Get("X-Hub-Signature-256")}
	for i, event := range []string{"check_run", "check_run", "check_run", "push", "workflow_run"} {
		if code := b.post(t, event, fmt.Sprintf("captured-%d", i), rerun.Body, sig); code != http.StatusAccepted {
			t.Fatalf("replay %d (%s): %d, want 202", i, event, code)
		}
	}
	if code := b.post(t, "check_run", rerun.ID, rerun.Body, sig); code != http.StatusOK {
		t.Fatalf("GitHub's redelivery: %d, want 200", code)
	}
	if after := b.counts(t); after != before {
		t.Fatalf("inbox/effects %v → %v: a replayed body wrote something", before, after)
	}
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := len(emu.Dispatches()); n != 2 {
		t.Fatalf("%d dispatches, want 2 (1 push + 1 re-run)", n)
	}
	if !strings.Contains(b.logText(), "replayed webhook body refused") {
		t.Fatal("no log line for the refused replays")
	}
}

// TestBodyUniqueMigrationKeepsLegacyReplays: migration 00020 applies to a
// database where the old ingest accepted replays (rows sharing a body under
// other delivery ids): it keeps them, marks each with the first row of its
// body (replay_of), and from then on the body is refused.
func TestBodyUniqueMigrationKeepsLegacyReplays(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, controlplane.Config{})
	src, err := os.ReadFile(filepath.Join("migrations", "00020_webhook_body_unique.sql"))
	must(t, err)
	up, down, ok := strings.Cut(string(src), "-- +goose Down")
	if !ok {
		t.Fatal("no Down section")
	}
	_, err = b.pool.Exec(b.ctx, down) // back to version 9's table
	must(t, err)
	body := []byte(`{"zen":"Approachable is better than simple.","hook_id":1}`)
	for i, d := range []string{"first", "replay-1", "other", "replay-2"} {
		insert := `INSERT INTO control_plane.webhook_inbox (delivery_id, event, body_sha256, normalized)
			VALUES ($1, 'ping', encode(sha256($2::bytea), 'hex'), '{}')`
		payload := body
		if d == "other" {
			payload = []byte(`{"zen":"other"}`)
		}
		if _, err := b.pool.Exec(b.ctx, insert, d, payload); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
	}
	_, err = b.pool.Exec(b.ctx, up)
	must(t, err)
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox WHERE replay_of =
		(SELECT id FROM control_plane.webhook_inbox WHERE delivery_id = 'first')`); n != 2 {
		t.Fatalf("%d rows marked as replays of the first, want 2", n)
	}
	if code := b.post(t, "ping", "replay-3", body, nil); code != http.StatusAccepted {
		t.Fatalf("a legacy body again: %d, want 202", code)
	}
	if n := b.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox`); n != 4 {
		t.Fatalf("%d inbox rows, want 4: the known body was written again", n)
	}
}
