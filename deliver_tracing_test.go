package pgoutbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

// TestLeaseDeliverTracing: effects enqueued under a recording span and
// delivered through the manual API ((*Lease).Deliver) each yield a consumer
// span "process q" in the enqueue's trace, a child of its send span, that
// the handler's ctx carries and that ends with the outcome and the state.
func TestLeaseDeliverTracing(t *testing.T) {
	t.Parallel()
	tr := pgtest.NewTraced(t)
	b := setup(t)
	ctx, request := tr.Start(b.ctx)
	ok := b.enqueueCtx(t, ctx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "ok"})
	bad := b.enqueueCtx(t, ctx, pgoutbox.Effect{Queue: "q", Type: "t", Key: "bad"})
	request.End()

	handled := map[int64]trace.SpanContext{}
	typ := pgoutbox.EffectType{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
		handled[d.ID] = trace.SpanContextFromContext(ctx)
		if d.Key == "bad" {
			return pgoutbox.Permanent(errors.New("422"))
		}
		return nil
	}}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, "q", "manual", 10, time.Minute)
	if err != nil || len(leases) != 2 {
		t.Fatalf("claim: %v (%d leases)", err, len(leases))
	}
	for _, l := range leases {
		if _, err := l.Deliver(b.ctx, b.pool, typ, pgoutbox.DeliverOptions{TracerProvider: tr.Provider}); err != nil {
			t.Fatal(err)
		}
	}
	for id, want := range map[int64][2]string{ok: {"success", "completed"}, bad: {"permanent", "dead_letter"}} {
		s := tr.CheckDelivery(t, "q", id, want[0], want[1])
		if handled[id].SpanID() != s.SpanContext.SpanID() {
			t.Errorf("effect %d: the handler's ctx carries span %s, want the process span %s", id, handled[id].SpanID(), s.SpanContext.SpanID())
		}
	}
}
