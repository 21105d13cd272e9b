package controlplane_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/adapters/github"
	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// The release control plane through a PgBouncer 1.18 in transaction mode
// (docs/poolers.md): webhooks, the lifecycle jobs and the GitHub effects
// all run through the pooler, in pgx's exec query mode.
func TestReleaseLifecycleThroughPgBouncer(t *testing.T) {
	t.Parallel()
	pooled, _ := pgtest.NewPooledDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pooled)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	b, mux := newBundleOn(t, pool)
	emu := fakegh.New(fakegh.Options{WebhookURL: b.srv.URL + "/webhooks/github", WebhookSecret: []byte(secret)})
	t.Cleanup(emu.Close)
	httpClient := &http.Client{Timeout: 10 * time.Second}
	tokens, err := github.NewTokenSource(httpClient, emu.URL(), emu.AppID(), emu.AppPrivateKey(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.mount(t, mux, github.NewClient(httpClient, emu.URL(), tokens), controlplane.Config{})
	b.startWorkers(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(b.logs.String())
		}
	})
	install(t, b, emu)
	b.waitFor(t, "repositories installed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.repositories WHERE state = 'active'`) == 2
	})
	_, err = emu.Push(b.ctx, repoName, "refs/tags/v1.0.0", sha1)
	must(t, err)
	snap := b.waitEmu(t, emu, "check run and dispatch", func(s fakegh.Snapshot) bool {
		return len(s.CheckRuns) == 1 && len(s.Dispatches) == 1
	})
	d := snap.Dispatches[0]
	b.waitFor(t, "workflow_run_id persisted", func() bool {
		return b.scalar(t, `SELECT count(*) FROM control_plane.execution_attempts WHERE workflow_run_id = $1 AND state = 'dispatched'`, d.RunID) == 1
	})
	_, err = emu.CompleteRun(b.ctx, d.RunID, "success")
	must(t, err)
	b.waitEmu(t, emu, "check run concluded", func(s fakegh.Snapshot) bool {
		return s.CheckRuns[0].Status == "completed" && s.CheckRuns[0].Conclusion == "success"
	})
	b.waitFor(t, "outbox idle", func() bool { return b.idle(t, controlplane.QueueOutbox) })
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`); n != 0 {
		t.Fatalf("%d effects not completed", n)
	}
	if len(emu.CheckRuns()) != 1 || len(emu.Dispatches()) != 1 {
		t.Fatalf("%d check runs, %d dispatches; want 1 each", len(emu.CheckRuns()), len(emu.Dispatches()))
	}
}
