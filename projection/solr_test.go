package projection_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	fake "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/internal/ops"
	"github.com/pgoutbox/pgoutbox/projection"
)

const solrCore = "records"

// setupSolr is setup with the Solr target on an emulator (basic auth).
func setupSolr(t *testing.T, cfg projection.Config) (*bundle, *fake.Server) {
	t.Helper()
	s := fake.New(fake.Options{Username: "solr", Password: "SolrRocks"})
	t.Cleanup(s.Close)
	cfg.Solr = &solr.Config{BaseURL: s.URL(), Core: solrCore, Username: "solr", Password: "SolrRocks", Timeout: 10 * time.Second}
	return setup(t, cfg), s
}

// importN imports n records r1..rn (with a title) as NDJSON.
func (b *bundle) importN(t *testing.T, n int, title string) {
	t.Helper()
	var sb strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&sb, `{"id":"r%d","title":"%s %d","n":%d}`+"\n", i, title, i, i)
	}
	code, out, _ := b.do(t, http.MethodPost, "/api/import", "application/x-ndjson", strings.NewReader(sb.String()))
	if res := decode[projection.ImportResult](t, out); code != 200 || res.Rejected != 0 {
		t.Fatalf("import: %d %s", code, out)
	}
}

// waitStates waits (events of c) until the queue holds want effects in
// state.
// drainStall is how long waitState waits without one more effect reaching
// its state before it fails.
const drainStall = 2 * time.Minute

func (b *bundle) waitState(t *testing.T, c *pgoutbox.Client, state string, want int64) {
	t.Helper()
	ch, done := c.Subscribe(1 << 16)
	defer done()
	count := func() int64 {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE queue = $1 AND state = $2::pgoutbox.effect_state`, projection.Queue, state)
	}
	last, lastAt := int64(-1), time.Now()
	for n := count(); n < want; n = count() {
		// Bounded by progress, not by a wall clock: a loaded machine only
		// delivers slower; a drain that stops fails after drainStall.
		if n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) >= drainStall {
			t.Fatalf("%d of %d effects %s, and none more for %s", n, want, state, drainStall)
		}
		select {
		case <-ch:
			// Drain whatever else arrived before re-counting.
			for len(ch) > 0 {
				<-ch
			}
		case <-time.After(2 * time.Second):
			// Events of other clients (none here) cannot arrive; re-count
			// as a fallback for outcomes recorded before Subscribe.
		case <-b.ctx.Done():
			t.Fatalf("%d of %d effects %s", count(), want, state)
		}
	}
}

func TestProjectTenThousandRecordsToSolr(t *testing.T) {
	t.Parallel()
	n := 10_000
	if testing.Short() {
		n = 1000
	}
	b, s := setupSolr(t, projection.Config{Concurrency: 8})
	b.ctx = context.WithoutCancel(b.ctx) // bounded by waitState's progress, not the bundle's 8 minutes
	b.importN(t, n, "Record")
	c := b.startClient(t)
	b.waitState(t, c, "completed", int64(n))
	if got := s.Count(solrCore); got != n {
		t.Fatalf("Solr holds %d documents, want %d", got, n)
	}
	d := s.Doc(solrCore, "r42")
	if d["title"] != "Record 42" || d[solr.VersionField] != json.Number("1") {
		t.Fatalf("r42: %v", d)
	}
	// Every add carried commitWithin: after it, search sees everything.
	s.Commit(solrCore)

	// A replay of a delivered effect sends no add and leaves one document.
	var effectID int64
	var payload []byte
	if err := b.pool.QueryRow(b.ctx, `SELECT id, payload FROM pgoutbox.effects WHERE payload->>'record_id' = 'r42'`).Scan(&effectID, &payload); err != nil {
		t.Fatal(err)
	}
	before := len(s.Calls())
	if err := b.app.Handle(b.ctx, &pgoutbox.Delivery{ID: effectID, Payload: payload}); err != nil {
		t.Fatal(err)
	}
	for _, call := range s.Calls()[before:] {
		if call.Handler == "update" {
			t.Fatalf("a replay sent an update: %+v", call)
		}
	}
	if s.Count(solrCore) != n {
		t.Fatalf("after replay: %d documents", s.Count(solrCore))
	}
}

func TestOutOfOrderOlderUpdateDoesNotWin(t *testing.T) {
	t.Parallel()
	b, s := setupSolr(t, projection.Config{})
	b.postJSON(t, "/api/records", `{"id":"o","title":"old"}`)
	b.postJSON(t, "/api/records", `{"id":"o","title":"new"}`)
	older, newer := b.staleThenCurrent(t)
	leases := []*pgoutbox.Lease{older, newer}
	var p1, p2 projection.Payload
	_ = json.Unmarshal(leases[0].Payload, &p1)
	_ = json.Unmarshal(leases[1].Payload, &p2)
	if p1.Version != 1 || p2.Version != 2 {
		t.Fatalf("payload versions %d %d", p1.Version, p2.Version)
	}
	// The newer effect is delivered first, the older one after it.
	for _, l := range []*pgoutbox.Lease{leases[1], leases[0]} {
		if err := b.app.Handle(b.ctx, &l.Delivery); err != nil {
			t.Fatal(err)
		}
	}
	if d := s.Doc(solrCore, "o"); d["title"] != "new" || d[solr.VersionField] != json.Number("2") || s.Count(solrCore) != 1 {
		t.Fatalf("Solr holds %v", d)
	}
	// A Solr document from a newer version than the effect's never gets
	// replaced even when the database is behind (e.g. a restored backup).
	s2 := fake.New(fake.Options{})
	t.Cleanup(s2.Close)
	c, _ := solr.New(solr.Config{BaseURL: s2.URL(), Core: solrCore})
	_, _ = c.Upsert(b.ctx, solr.Document{ID: "o", Version: 7, SourceHash: "h", Fields: map[string]any{"title": "future"}})
	res, err := c.Upsert(b.ctx, solr.Document{ID: "o", Version: 2, SourceHash: "h2", Fields: map[string]any{"title": "new"}})
	if err != nil || res != solr.SkippedNewer || s2.Doc(solrCore, "o")["title"] != "future" {
		t.Fatalf("older after newer: %v %v %v", res, err, s2.Doc(solrCore, "o"))
	}
}

func TestSolrOutageRetriesThenDeadLettersAndReplayCompletes(t *testing.T) {
	t.Parallel()
	b, s := setupSolr(t, projection.Config{MaxAttempts: 3})
	b.importN(t, 5, "Down")
	s.InjectFault(fake.FaultRule{Kind: fake.FaultStatus, Status: 503})
	c := b.startClient(t)
	b.waitState(t, c, "dead_letter", 5)
	rows, err := b.pool.Query(b.ctx, `SELECT attempts, last_error FROM pgoutbox.effects WHERE queue = $1`, projection.Queue)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var attempts int
		var lastErr string
		if err := rows.Scan(&attempts, &lastErr); err != nil {
			t.Fatal(err)
		}
		if attempts != 3 || !strings.Contains(lastErr, "HTTP 503") || strings.Contains(lastErr, "SolrRocks") {
			t.Errorf("dead letter: attempts %d, last_error %q", attempts, lastErr)
		}
	}
	if n := len(s.Calls()); n != 15 {
		t.Errorf("%d calls to Solr, want 15 (5 effects × 3 attempts, each stopped at its first 503)", n)
	}
	if s.Count(solrCore) != 0 {
		t.Fatal("documents written during the outage")
	}
	// The outage ends; `dlq replay` brings them back and they complete.
	s.ClearFaults()
	res, err := ops.ReplayDeadLetters(b.ctx, b.pool, ops.ReplayOptions{Filter: ops.Filter{Queue: projection.Queue}})
	if err != nil || len(res.Replayed) != 5 {
		t.Fatalf("replay: %v %+v", err, res)
	}
	b.waitState(t, c, "completed", 5)
	if s.Count(solrCore) != 5 {
		t.Fatalf("after replay Solr holds %d documents", s.Count(solrCore))
	}
}

func TestRetryBackoffUsesDatabaseClock(t *testing.T) {
	t.Parallel()
	b, s := setupSolr(t, projection.Config{BackoffCap: time.Hour})
	b.importN(t, 1, "Slow")
	s.InjectFault(fake.FaultRule{Kind: fake.FaultStatus, Status: 500})
	sum, err := b.app.RunBatch(b.ctx, 10)
	if err != nil || sum.Claimed != 1 || sum.Retried != 1 {
		t.Fatalf("batch: %v %+v", err, sum)
	}
	// attempt 1 → 2^1 s ± 10 %.
	var wait float64
	if err := b.pool.QueryRow(b.ctx, `SELECT extract(epoch FROM available_at - now())::float8 FROM pgoutbox.effects`).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	if wait < 1.5 || wait > 2.3 {
		t.Fatalf("retry in %.2fs, want ≈2s", wait)
	}
	// Not claimable before its backoff.
	if sum, err := b.app.RunBatch(b.ctx, 10); err != nil || sum.Claimed != 0 {
		t.Fatalf("claimed during backoff: %+v %v", sum, err)
	}
}
