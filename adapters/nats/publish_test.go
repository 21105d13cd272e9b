package nats_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/adapters/nats"
)

func TestPublishEffectType(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	created, err := pgnats.PublishEffect("events", "orders.created", map[string]any{"order": 42}, pgoutbox.Key("order.created", "42"))
	if err != nil {
		t.Fatal(err)
	}
	// The same message id from another queue (a resend after an unknown
	// outcome looks the same to JetStream): a duplicate ack is success.
	again := created
	again.Queue = "other"
	ids := b.enqueue(t,
		created, again,
		pgoutbox.Effect{Queue: "events", Type: "nats.publish", Key: "bad", Payload: map[string]any{"subject": "orders.*"}},
		pgoutbox.Effect{Queue: "events", Type: "nats.publish", Key: "nostream", MaxAttempts: 2,
			Payload: map[string]any{"subject": "nowhere.at.all", "data": 1}},
	)
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		Queues:     map[string]pgoutbox.QueueConfig{"events": {Concurrency: 1}, "other": {}},
		Types:      []pgoutbox.EffectType{pgnats.PublishType(b.js)},
		BackoffCap: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	b.waitFor(t, "every effect settled", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state IN ('completed', 'dead_letter')`) == 4
	})
	want := []string{"completed", "completed", "dead_letter", "dead_letter"}
	for i, id := range ids {
		var state string
		var attempts int
		if err := b.pool.QueryRow(b.ctx, `SELECT state::text, attempts FROM pgoutbox.effects WHERE id = $1`, id).Scan(&state, &attempts); err != nil {
			t.Fatal(err)
		}
		if state != want[i] {
			t.Errorf("effect %d: %s, want %s", i, state, want[i])
		}
		if i == 2 && attempts != 1 {
			t.Errorf("a bad subject is permanent: %d attempts", attempts)
		}
		if i == 3 && attempts != 2 {
			t.Errorf("no stream is retried: %d attempts, want 2", attempts)
		}
	}
	info, err := st.Info(b.ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("stream: %v, %d messages; want the one message", err, info.State.Msgs)
	}
	msg, err := st.GetMsg(b.ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]int
	if msg.Header.Get(jetstream.MsgIDHeader) != created.Key || json.Unmarshal(msg.Data, &body) != nil || body["order"] != 42 {
		t.Fatalf("message: id %q, body %s", msg.Header.Get(jetstream.MsgIDHeader), msg.Data)
	}
}
