package ops_test

import (
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

func TestStatusExactCountsAndAges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.inTx(t, func(tx pgx.Tx) {
		seed(t, b.ctx, tx,
			eff{queue: "mail", typ: "email.send", state: "available", availableAgo: 754}, // oldest due: 12m34s
			eff{queue: "mail", typ: "email.send", state: "available", availableAgo: 10},
			eff{queue: "mail", typ: "email.send", state: "available", attempts: 2, availableAgo: -30}, // retrying, not due
			eff{queue: "mail", typ: "email.bounce", state: "available", attempts: 1, availableAgo: 5},
			eff{queue: "mail", typ: "email.send", state: "leased", attempts: 1, leasedAgo: 11 * 60}, // stalled
			eff{queue: "mail", typ: "email.send", state: "leased", attempts: 1, leasedAgo: 9 * 60},
			eff{queue: "mail", typ: "email.send", state: "dead_letter", attempts: 8, completedAgo: 60},
			eff{queue: "mail", typ: "email.send", state: "completed", attempts: 1, createdAgo: 40, completedAgo: 10},   // lag 30 s
			eff{queue: "mail", typ: "email.send", state: "completed", attempts: 1, createdAgo: 20, completedAgo: 10},   // lag 10 s
			eff{queue: "mail", typ: "email.send", state: "completed", attempts: 1, createdAgo: 900, completedAgo: 400}, // outside the window
			eff{queue: "gh", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 100, started: true},
			eff{queue: "gh", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 90, started: true},
		)
		snap, err := ops.Status(b.ctx, tx, ops.StatusOptions{StalledAfter: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Queues) != 2 || snap.Queues[0].Queue != "gh" || snap.Queues[1].Queue != "mail" {
			t.Fatalf("queues: %+v", snap.Queues)
		}
		gh, mail := snap.Queues[0], snap.Queues[1]
		if gh.ReconciliationRequired != 2 || gh.Available != 0 || gh.LagP50Seconds != nil {
			t.Fatalf("gh: %+v", gh)
		}
		want := ops.Counts{Queue: "mail", Available: 4, Retrying: 2, Leased: 2, StalledLeases: 1, DeadLetter: 1,
			CompletedRecent: 2, OldestAvailableAgeSeconds: 754}
		got := mail
		got.LagP50Seconds, got.LagP99Seconds = nil, nil
		if got != want {
			t.Fatalf("mail:\n got %+v\nwant %+v", got, want)
		}
		// percentile_cont over lags {10, 30}: p50 = 20, p99 = 10 + 0.99*20.
		if mail.LagP50Seconds == nil || *mail.LagP50Seconds != 20 ||
			mail.LagP99Seconds == nil || math.Abs(*mail.LagP99Seconds-29.8) > 1e-9 {
			t.Fatalf("lag: p50 %v p99 %v", deref(mail.LagP50Seconds), deref(mail.LagP99Seconds))
		}
		// Per type: email.bounce is one available retrying effect of age 5 s.
		var bounce *ops.Counts
		for i := range snap.Types {
			if snap.Types[i].Type == "email.bounce" {
				bounce = &snap.Types[i]
			}
		}
		if len(snap.Types) != 3 || bounce == nil || bounce.Available != 1 || bounce.Retrying != 1 ||
			bounce.OldestAvailableAgeSeconds != 5 {
			t.Fatalf("types: %+v", snap.Types)
		}
		tot := snap.Total()
		if tot.Available != 4 || tot.ReconciliationRequired != 2 || tot.OldestAvailableAgeSeconds != 754 || tot.LagP50Seconds != nil {
			t.Fatalf("total: %+v", tot)
		}

		// Filters narrow, literally.
		snap, err = ops.Status(b.ctx, tx, ops.StatusOptions{Filter: ops.Filter{Queue: "mail", Type: "email.bounce"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Queues) != 1 || snap.Queues[0].Available != 1 || snap.Queues[0].Leased != 0 {
			t.Fatalf("filtered: %+v", snap.Queues)
		}
		snap, err = ops.Status(b.ctx, tx, ops.StatusOptions{Filter: ops.Filter{Queue: "mail' OR '1'='1"}})
		if err != nil || len(snap.Queues) != 0 {
			t.Fatalf("injection filter matched: %v %+v", err, snap)
		}
	})
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestStatusEmptyDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t)
	snap, err := ops.Status(b.ctx, b.pool, ops.StatusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Queues) != 0 || snap.StalledAfterSeconds != 600 || snap.LagWindowSeconds != 300 || snap.TakenAt.IsZero() {
		t.Fatalf("%+v", snap)
	}
}
