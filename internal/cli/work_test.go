package cli_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/nats"
	fakesolr "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/internal/cli"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/projection"
)

// embeddedJetStream runs a NATS server with JetStream until the test ends
// and returns its URL and a JetStream client.
func embeddedJetStream(t *testing.T) (string, jetstream.JetStream) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("NATS not ready")
	}
	nc, err := natsgo.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return ns.ClientURL(), js
}

func TestWorkRefusesAShortDuplicateWindow(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDB(t)
	url, js := embeddedJetStream(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PGOUTBOX", Subjects: []string{"pgoutbox.>"},
		Retention: jetstream.WorkQueuePolicy, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run(t, "--database-url", dsn, "work", "--metrics-addr", "127.0.0.1:0", "--relay", "nats", "--nats-url", url, "--relay-queues", "q")
	if code != cli.ExitCouldNotRun || !strings.Contains(errs, "duplicate window of 2m0s") || !strings.Contains(errs, "retry horizon") {
		t.Fatalf("exit %d, stderr %q; want 1 and the reason", code, errs)
	}
	if code, _, errs := run(t, "--database-url", dsn, "work", "--metrics-addr", "127.0.0.1:0", "--relay", "kafka"); code != cli.ExitCouldNotRun || !strings.Contains(errs, "nats") {
		t.Fatalf("--relay kafka: exit %d, %q", code, errs)
	}
}

// syncBuffer is a bytes.Buffer safe to read while work writes to it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWorkRelaysToNATS(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	url, js := embeddedJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "q", Type: "nats.publish", Key: "a"}, {Queue: "q", Type: "nats.publish", Key: "b"},
			{Queue: "q", Type: "nats.publish", Key: "c"},
		})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(wctx, []string{"--database-url", dsn, "work", "--metrics-addr", "127.0.0.1:0", "--relay", "nats", "--nats-url", url,
			"--relay-queues", "q", "--sweep-interval", "1h"}, &out, &out)
	}()
	handedOver := func() int64 {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects WHERE lease_owner = $1`, nats.HandoffOwner).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitUntil(t, ctx, func() bool { return handedOver() == 3 })
	st, err := js.Stream(ctx, "PGOUTBOX")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs != 3 {
		t.Fatalf("stream: %v %+v", err, info)
	}
	// work serves /metrics too.
	var metricsURL string
	waitUntil(t, ctx, func() bool {
		text := out.String()
		if i := strings.Index(text, "pgoutbox metrics on "); i >= 0 {
			metricsURL = strings.Fields(text[i+len("pgoutbox metrics on "):])[0]
		}
		return metricsURL != ""
	})
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "pgoutbox_") {
		t.Fatalf("work /metrics: %d, no pgoutbox_ metrics", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("work exited %d: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "relaying q to NATS stream PGOUTBOX") {
		t.Fatalf("work output: %q", out.String())
	}
}

func waitUntil(t *testing.T, ctx context.Context, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatal("timed out")
		}
	}
}

// work --relay nats --from nats delivers relayed effects with the registered
// handlers: here nats.publish, which work registers itself.
func TestWorkRelaysAndConsumes(t *testing.T) {
	t.Parallel()
	pool, dsn := pgtest.NewPool(t)
	url, js := embeddedJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}, Duplicates: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, k := range []string{"a", "b", "c"} {
			if _, err := pgoutbox.Enqueue(ctx, tx, pgoutbox.Effect{Queue: "q", Type: "nats.publish", Key: k,
				Payload: map[string]any{"subject": "events." + k, "data": map[string]string{"k": k}}}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(wctx, []string{"--database-url", dsn, "work", "--metrics-addr", "127.0.0.1:0", "--relay", "nats", "--from", "nats",
			"--nats-url", url, "--relay-queues", "q"}, &out, &out)
	}()
	waitUntil(t, ctx, func() bool {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed' AND attempts = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 3
	})
	info, err := events.Info(ctx)
	if err != nil || info.State.Msgs != 3 {
		t.Fatalf("EVENTS stream: %v %+v", err, info)
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("work exited %d: %s", code, out.String())
	}
	if !strings.Contains(out.String(), "delivering q from NATS stream PGOUTBOX") {
		t.Fatalf("work output: %q", out.String())
	}
}

// work --relay nats --from nats keeps the applications' ordering choices
// for the queues it relays, which it takes out of its in-process Client:
// the relay and the consumer record them. Here the projection (its Solr
// target on, a fake) relayed through NATS: record.upsert's dead letters let
// a record's later versions through. It sets environment variables
// (t.Setenv), so it does not run in parallel.
func TestWorkRelayKeepsTheOrderingChoices(t *testing.T) {
	pool, dsn := pgtest.NewPool(t)
	url, _ := embeddedJetStream(t)
	s := fakesolr.New(fakesolr.Options{})
	t.Cleanup(s.Close)
	t.Setenv("OUTBOX_PROJECT_TO_SOLR", "1")
	t.Setenv("SOLR_BASE_URL", s.URL())
	t.Setenv("SOLR_CORE", fakesolr.CoreDefault)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	wctx, stop := context.WithCancel(ctx)
	var out syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(wctx, []string{"--database-url", dsn, "work", "--metrics-addr", "127.0.0.1:0", "--relay", "nats", "--from", "nats",
			"--nats-url", url, "--relay-queues", projection.Queue}, &out, &out)
	}()
	// Stopped only once the in-process client runs too ("working", after
	// the consumer's "delivering"): a stop during its start exits 1.
	waitUntil(t, ctx, func() bool {
		return strings.Contains(out.String(), "delivering "+projection.Queue+" from NATS") && strings.Contains(out.String(), "pgoutbox working ")
	})
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("work exited %d: %s", code, out.String())
	}
	var movesOn bool
	if err := pool.QueryRow(ctx, `SELECT dead_letter_moves_on FROM pgoutbox.ordering_choices
		WHERE queue = $1 AND effect_type = $2`, projection.Queue, projection.EffectType).Scan(&movesOn); err != nil || !movesOn {
		t.Fatalf("ordering choice of %s in the relayed queue: moves on %v (%v), want it to move on", projection.EffectType, movesOn, err)
	}
}
