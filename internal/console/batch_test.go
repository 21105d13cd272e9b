package console_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestEffectsOfABatchQueue: a batch queue's effects that never left
// pgoutbox.stream are in the effects list, its searches, the effect page and
// ops.EffectHistory, with the state pgoutbox.effect_states gives them:
// available before a Client runs, leased while their batch is in delivery,
// completed once it is settled. They are merged with the rows of
// pgoutbox.effects newest first, and "Older →" pages across both storages.
func TestEffectsOfABatchQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, token, false)
	if err := pgoutbox.SetStorage(e.ctx, e.pool, "bq", pgoutbox.StorageBatch); err != nil {
		t.Fatal(err)
	}
	enqueue := func(f pgoutbox.Effect) int64 {
		t.Helper()
		var id int64
		if err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) (err error) {
			id, err = pgoutbox.Enqueue(e.ctx, tx, f)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Ids alternate between a rows queue and the batch queue; two of the
	// batch queue's effects have ordering keys, each its own (a page runs
	// one effect of a key; a key's later ones would become rows).
	var all, batch []string
	for i := range 3 {
		r := enqueue(pgoutbox.Effect{Queue: "rq", Type: "rt", Key: fmt.Sprintf("r-%d", i)})
		f := pgoutbox.Effect{Queue: "bq", Type: "bt", Key: fmt.Sprintf("b-%d", i),
			Payload: map[string]string{"record_id": fmt.Sprintf("rec-%d", i)}}
		if i < 2 {
			f.OrderingKey = fmt.Sprintf("acct-%d", 9-2*i) // acct-9, acct-7
		}
		s := enqueue(f)
		all = append(all, strconv.FormatInt(r, 10), strconv.FormatInt(s, 10))
		batch = append(batch, strconv.FormatInt(s, 10))
	}
	slices.Reverse(all)
	slices.Reverse(batch)
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.stream WHERE queue = 'bq'`); n != 3 {
		t.Fatalf("%d of the batch queue's effects in the stream, want 3", n)
	}
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'bq'`); n != 0 {
		t.Fatalf("%d of the batch queue's effects are rows, want none", n)
	}

	c := e.client(t)
	e.signIn(t, c, "alice")
	rowRE := regexp.MustCompile(`(?s)<tr data-id="(\d+)">.*?<span class="state">([a-z_]+)</span>`)
	list := func(q string) (ids []string, states map[string]string) {
		t.Helper()
		a := do(t, c, "GET", e.srv.URL+"/console/effects"+q, nil)
		if a.code != http.StatusOK {
			t.Fatalf("effects%s: %d %s", q, a.code, a.body)
		}
		states = map[string]string{}
		for _, m := range rowRE.FindAllStringSubmatch(a.body, -1) {
			ids = append(ids, m[1])
			states[m[1]] = m[2]
		}
		return ids, states
	}
	// expect checks each search's ids, newest first, all in state.
	expect := func(when, state string, searches map[string][]string) {
		t.Helper()
		for q, want := range searches {
			got, states := list(q)
			if !slices.Equal(got, want) {
				t.Errorf("%s: effects%s lists %v, want %v", when, q, got, want)
			}
			for id, s := range states {
				if slices.Contains(batch, id) && s != state {
					t.Errorf("%s: effects%s shows effect %s %s, want %s", when, q, id, s, state)
				}
			}
		}
	}
	expect("before delivery", "available", map[string][]string{
		"":                                     all,
		"?queue=bq":                            batch,
		"?queue=bq&state=available":            batch,
		"?queue=bq&state=completed":            nil,
		"?state=leased":                        nil,
		"?type=bt":                             batch,
		"?key=b-":                              batch,
		"?queue=bq&key=b-1":                    batch[1:2],
		"?ordering_key=acct-9":                 batch[2:],
		"?ordering_key=acct-9&state=available": batch[2:],
		"?queue=bq&ordering_key=acct-9&state=leased": nil,
		"?queue=bq&error=boom":                       nil,
		"?queue=bq&state=dead_letter":                nil,
		"?queue=rq":                                  {all[1], all[3], all[5]},
	})
	// Paging: 4 per page, across both storages, none twice, none missed.
	var seen []string
	next := "/console/effects?limit=4"
	for next != "" {
		a := do(t, c, "GET", e.srv.URL+next, nil)
		for _, m := range rowRE.FindAllStringSubmatch(a.body, -1) {
			seen = append(seen, m[1])
		}
		m := regexp.MustCompile(`id="next" href="([^"]+)"`).FindStringSubmatch(a.body)
		next = ""
		if m != nil {
			next = strings.ReplaceAll(m[1], "&amp;", "&")
		}
	}
	if !slices.Equal(seen, all) {
		t.Errorf("paged ids %v, want %v", seen, all)
	}
	page := func(id string) string {
		t.Helper()
		a := do(t, c, "GET", e.srv.URL+"/console/effects/"+id, nil)
		if a.code != http.StatusOK {
			t.Fatalf("effect %s: %d %s", id, a.code, a.body)
		}
		return a.body
	}
	if p := page(batch[0]); !strings.Contains(p, `<span class="state" id="state">available</span>`) ||
		!strings.Contains(p, "record rec-2") || strings.Contains(p, `id="cancel-button"`) {
		t.Errorf("effect page of a stream effect before delivery (available, its subject, no cancel: a cancel does not reach the stream):\n%s", p)
	}

	// A Client delivers the batch; the ordered effects one after another,
	// so the first one's handler holds the batch leased until released.
	entered := make(chan int64, 3)
	release := make(chan struct{})
	cl, err := pgoutbox.NewClient(e.pool, pgoutbox.Config{
		HeartbeatInterval: -1, SampleInterval: -1, PollInterval: 20 * time.Millisecond,
		Queues: map[string]pgoutbox.QueueConfig{"bq": {Storage: pgoutbox.StorageBatch,
			DeliveryTimeout: 50 * time.Second, PageHold: 40 * time.Second}},
		Types: []pgoutbox.EffectType{{Name: "bt", ReplaySafe: true,
			Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
				entered <- d.ID
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open) // before Stop: a held handler would hold Stop
	select {
	case <-entered:
	case <-e.ctx.Done():
		t.Fatal("no delivery started")
	}
	expect("in delivery", "leased", map[string][]string{
		"?queue=bq":                         batch,
		"?queue=bq&state=leased":            batch,
		"?queue=bq&state=available":         nil,
		"?ordering_key=acct-9&state=leased": batch[2:],
	})
	open()
	pgtest.WaitFor(t, e.ctx, "the batch settled", func() bool {
		ids, _ := list("?queue=bq&state=completed")
		return len(ids) == 3
	})
	expect("after delivery", "completed", map[string][]string{
		"":                                     all,
		"?queue=bq":                            batch,
		"?queue=bq&state=completed":            batch,
		"?queue=bq&state=available":            nil,
		"?ordering_key=acct-9&state=available": nil,
		"?ordering_key=acct-9":                 batch[2:],
	})
	if n := e.count(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = 'bq'`); n != 0 {
		t.Fatalf("%d of the batch queue's effects became rows, want none: the test would not show the stream", n)
	}
	if p := page(batch[0]); !strings.Contains(p, `<span class="state" id="state">completed</span>`) ||
		!strings.Contains(p, "completed (delivered from its batch, settled)") {
		t.Errorf("effect page of a stream effect after delivery (completed, in its timeline):\n%s", p)
	}
	id, _ := strconv.ParseInt(batch[0], 10, 64)
	h, found, err := ops.EffectHistory(e.ctx, e.pool, id, 0)
	if err != nil || !found {
		t.Fatalf("history of a stream effect: found %v, %v", found, err)
	}
	var kinds []string
	for _, ev := range h.Events {
		kinds = append(kinds, ev.Kind)
	}
	if h.State != "completed" || h.Storage != "batch" || h.Attempts != 1 || h.Queue != "bq" ||
		!slices.Equal(kinds, []string{"enqueued", "completed"}) {
		t.Errorf("history of a stream effect: state %q storage %q attempts %d queue %q events %v",
			h.State, h.Storage, h.Attempts, h.Queue, kinds)
	}
	r, _ := strconv.ParseInt(all[1], 10, 64)
	if h, found, err := ops.EffectHistory(e.ctx, e.pool, r, 0); err != nil || !found || h.Storage != "rows" || h.State != "available" {
		t.Errorf("history of a row: %+v, %v, %v", h, found, err)
	}
}
