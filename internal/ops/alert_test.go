package ops_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

// TestAlertRulesFireExactlyAtThreshold seeds, for each rule, a value equal to
// its threshold and one just below it, in a transaction so that ages are
// measured at one database clock, and checks that only the first fires.
func TestAlertRulesFireExactlyAtThreshold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	th := ops.Thresholds{DeadLetters: 3, Retrying: 4, Pending: 5, PendingMaxAge: 900 * time.Second, XminMaxAge: time.Hour}
	many := func(n int, e eff) []eff {
		out := make([]eff, n)
		for i := range out {
			out[i] = e
		}
		return out
	}
	cases := []struct {
		rule        string
		at, below   []eff
		atV, belowV float64
	}{
		{rule: ops.RuleDeadLetters,
			at:    many(3, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1}),
			below: many(2, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1}),
			atV:   3, belowV: 2},
		{rule: ops.RuleRetrying,
			at:    many(4, eff{queue: "q", typ: "t", state: "available", attempts: 1, availableAgo: -60}),
			below: many(3, eff{queue: "q", typ: "t", state: "available", attempts: 1, availableAgo: -60}),
			atV:   4, belowV: 3},
		{rule: ops.RulePending,
			at:    many(5, eff{queue: "q", typ: "t", state: "available", availableAgo: 1}),
			below: many(4, eff{queue: "q", typ: "t", state: "available", availableAgo: 1}),
			atV:   5, belowV: 4},
		{rule: ops.RulePendingAge,
			at:    []eff{{queue: "q", typ: "t", state: "available", availableAgo: 900}},
			below: []eff{{queue: "q", typ: "t", state: "available", availableAgo: 899.999}},
			atV:   900, belowV: 899.999},
		{rule: ops.RuleReconciliationRequired,
			at:    []eff{{queue: "q", typ: "t", state: "reconciliation_required", attempts: 1, leasedAgo: 1, started: true}},
			below: nil,
			atV:   1, belowV: 0},
		// A lease taken exactly StalledAfterDefault (10 min) ago is stalled;
		// one taken a millisecond later is not.
		{rule: ops.RuleStalledLeases,
			at:    []eff{{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 600}},
			below: []eff{{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 599.999}},
			atV:   1, belowV: 0},
	}
	for _, c := range cases {
		for _, at := range []bool{true, false} {
			effs, want := c.below, c.belowV
			if at {
				effs, want = c.at, c.atV
			}
			b.inTx(t, func(tx pgx.Tx) {
				seed(t, b.ctx, tx, effs...)
				snap, err := ops.Status(b.ctx, tx, ops.StatusOptions{})
				if err != nil {
					t.Fatal(err)
				}
				rep := ops.Evaluate(snap, th)
				for _, r := range rep.Rules {
					if r.Rule != c.rule {
						if r.Firing {
							t.Errorf("%s (at=%v): unrelated rule %s fired: %+v", c.rule, at, r.Rule, r)
						}
						continue
					}
					if r.Value != want || r.Firing != at {
						t.Errorf("%s (at=%v): value %v firing %v; want value %v firing %v", c.rule, at, r.Value, r.Firing, want, at)
					}
				}
				if rep.Firing != at {
					t.Errorf("%s (at=%v): report firing %v", c.rule, at, rep.Firing)
				}
			})
		}
	}
}

func TestAlertThresholdZeroDisables(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1})
	snap, err := ops.Status(b.ctx, b.pool, ops.StatusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	th := ops.DefaultThresholds()
	if rep := ops.Evaluate(snap, th); !rep.Firing || rep.FiringRules()[0].Rule != ops.RuleDeadLetters {
		t.Fatalf("default thresholds: %+v", rep)
	}
	th.DeadLetters = 0
	rep := ops.Evaluate(snap, th)
	if rep.Firing || !rep.Rules[0].Disabled {
		t.Fatalf("disabled rule fired: %+v", rep.Rules[0])
	}
}

// TestAlertXminAge holds a REPEATABLE READ transaction open on another
// connection and reads its age at one database clock: the rule fires at
// exactly that age and not a microsecond above it; once it ends, the value
// is 0.
func TestAlertXminAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	htx, err := holder.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := htx.Exec(b.ctx, `SELECT count(*) FROM pgoutbox.effects`); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	b.inTx(t, func(tx pgx.Tx) {
		snap, err := ops.Status(b.ctx, tx, ops.StatusOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v := snap.OldestXminAgeSeconds
		if v <= 0 || snap.XminHolders != 1 {
			t.Fatalf("xmin age %v holders %d", v, snap.XminHolders)
		}
		th := ops.DefaultThresholds()
		th.XminMaxAge = time.Duration(v * float64(time.Second))
		if r := rule(ops.Evaluate(snap, th), ops.RuleXminAge); !r.Firing {
			t.Fatalf("at threshold: %+v", r)
		}
		th.XminMaxAge += time.Microsecond
		if r := rule(ops.Evaluate(snap, th), ops.RuleXminAge); r.Firing {
			t.Fatalf("below threshold: %+v", r)
		}
	})
	if err := htx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	snap, err := ops.Status(b.ctx, b.pool, ops.StatusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.OldestXminAgeSeconds != 0 || snap.XminHolders != 0 {
		t.Fatalf("after the transaction ended: %v %d", snap.OldestXminAgeSeconds, snap.XminHolders)
	}
}

func rule(rep *ops.AlertReport, name string) ops.RuleResult {
	for _, r := range rep.Rules {
		if r.Rule == name {
			return r
		}
	}
	return ops.RuleResult{}
}

func TestPostAlert(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool,
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1},
		eff{queue: "q", typ: "t", state: "reconciliation_required", attempts: 1, leasedAgo: 1, started: true})
	snap, err := ops.Status(b.ctx, b.pool, ops.StatusOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rep := ops.Evaluate(snap, ops.DefaultThresholds())

	bodies := make(chan []byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		bodies <- body
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	if err := ops.PostAlert(b.ctx, srv.Client(), srv.URL+"/hook", rep, 0); err != nil {
		t.Fatal(err)
	}
	var got ops.WebhookAlert
	if err := json.Unmarshal(<-bodies, &got); err != nil {
		t.Fatal(err)
	}
	if got.Source != "pgoutbox" || got.Status != "firing" || len(got.Firing) != 2 ||
		got.Firing[0].Rule != ops.RuleDeadLetters || got.Firing[1].Rule != ops.RuleReconciliationRequired ||
		len(got.Rules) != 7 || !strings.Contains(got.Summary, "dead_letters 1 >= 1") {
		t.Fatalf("posted: %+v", got)
	}
}

func TestPostAlertFailuresNeverShowTheURL(t *testing.T) {
	t.Parallel()
	rep := &ops.AlertReport{Firing: true, Rules: []ops.RuleResult{{Rule: ops.RuleDeadLetters, Value: 1, Threshold: 1, Firing: true}}}
	const secret = "T000-SECRET-hook-token"

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer failing.Close()
	release := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer hanging.Close()
	defer close(release)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	for name, c := range map[string]struct {
		url  string
		want string
	}{
		"5xx":     {failing.URL + "/services/" + secret, "answered 500"},
		"timeout": {hanging.URL + "/services/" + secret, "no answer within 200ms"},
		"refused": {closedURL + "/services/" + secret, "refused"},
		"invalid": {"http://[::1" + secret, "invalid OUTBOX_ALERT_WEBHOOK_URL"},
	} {
		err := ops.PostAlert(context.Background(), nil, c.url, rep, 200*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error shows the webhook URL: %v", name, err)
		}
	}
}
