package projection_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/projection"
)

// /workers lists the ordering keys whose effects wait, and the head that
// holds each back: here a record's second version waits behind its first,
// which is leased (in delivery).
func TestWorkersPageShowsBlockedKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, projection.Config{CronSecret: cronSecret})
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(b.ctx, tx, []pgoutbox.Effect{
			{Queue: projection.Queue, Type: projection.EffectType, Key: "v1", OrderingKey: "rec-42"},
			{Queue: projection.Queue, Type: projection.EffectType, Key: "v2", OrderingKey: "rec-42"},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 10, time.Minute)
	if err != nil || len(leases) != 1 || leases[0].Key != "v1" {
		t.Fatalf("claimed %d leases (%v), want v1 alone: v2 waits behind it", len(leases), err)
	}
	code, out, _ := b.do(t, http.MethodGet, "/workers?format=json", "", nil)
	if code != 200 {
		t.Fatalf("json: %d %s", code, out)
	}
	rep := decode[projection.WorkersReport](t, out)
	if len(rep.Blocked) != 1 || rep.Blocked[0].OrderingKey != "rec-42" || rep.Blocked[0].Waiting != 1 ||
		rep.Blocked[0].HeadID != leases[0].ID || rep.Blocked[0].HeadState != "leased" || rep.Blocked[0].Stuck {
		t.Fatalf("blocked keys: %+v", rep.Blocked)
	}
	_, html, _ := b.do(t, http.MethodGet, "/workers", "", nil)
	if page := string(html); !strings.Contains(page, `<table id="blocked">`) || !strings.Contains(page, "<td>rec-42</td>") {
		t.Fatalf("the page does not list the blocked key:\n%s", page)
	}
}
