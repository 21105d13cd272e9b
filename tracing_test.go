package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
)

// A traceparent as a tracing SDK writes it (W3C Trace Context's example).
const goodTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// orNull is *s quoted, or NULL.
func orNull(s *string) string {
	if s == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *s)
}

func (b *bundle) traceparent(t *testing.T, id int64) *string {
	t.Helper()
	var tp *string
	if err := b.pool.QueryRow(b.ctx, `SELECT traceparent FROM pgoutbox.effects WHERE id = $1`, id).Scan(&tp); err != nil {
		t.Fatal(err)
	}
	return tp
}

// TestEnqueueTraceparent: Go's Enqueue keeps no traceparent without a trace
// (nothing more is written by default), keeps the span's under an SDK, and
// passes an incoming trace on even without an SDK (the global provider is
// a no-op in this package's tests).
func TestEnqueueTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	none := b.enqueue(t, pgoutbox.Effect{Queue: "q", Type: "t", Key: "none"})[0]
	if tp := b.traceparent(t, none); tp != nil {
		t.Errorf("no trace: traceparent %q, want NULL", *tp)
	}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(b.ctx, "request")
	var id int64
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		ids, err := pgoutbox.EnqueueBatch(ctx, tx, []pgoutbox.Effect{
			{Queue: "q", Type: "t", Key: "sdk-1"}, {Queue: "q", Type: "t", Key: "sdk-2"}})
		id = ids[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	span.End()
	var send tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "send q" {
			send = s
		}
	}
	want := "00-" + send.SpanContext.TraceID().String() + "-" + send.SpanContext.SpanID().String() + "-01"
	if got := b.traceparent(t, id); got == nil || *got != want || send.Parent.SpanID() != span.SpanContext().SpanID() {
		t.Errorf("under an SDK: traceparent %s, want the send span's %q (a child of the request)", orNull(got), want)
	}
	if send.SpanKind != trace.SpanKindProducer || len(send.Attributes) == 0 {
		t.Errorf("send span: %v %v", send.SpanKind, send.Attributes)
	}

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2},
		TraceFlags: trace.FlagsSampled, Remote: true})
	remote := b.enqueueCtx(t, trace.ContextWithRemoteSpanContext(b.ctx, sc), pgoutbox.Effect{Queue: "q", Type: "t", Key: "remote"})
	if got := b.traceparent(t, remote); got == nil || *got != "00-01000000000000000000000000000000-0200000000000000-01" {
		t.Errorf("an incoming trace without an SDK: traceparent %s, want the incoming one", orNull(got))
	}
}

func (b *bundle) enqueueCtx(t *testing.T, ctx context.Context, e pgoutbox.Effect) int64 {
	t.Helper()
	var id int64
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) (err error) {
		id, err = pgoutbox.Enqueue(ctx, tx, e)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestSQLEnqueueTraceparent: the SQL API keeps a W3C traceparent given to
// enqueue or enqueue_batch, as pgoutbox_enqueuer, and a delivery continues
// it; anything else but NULL is refused with OB001 and writes nothing,
// however long.
func TestSQLEnqueueTraceparent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.grantEnqueue(t, "pgoutbox_enqueuer", "q", "t")
	var ids []int64
	if err := b.asRole("pgoutbox_enqueuer", func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(b.ctx, `SELECT pgoutbox.enqueue('q', 't', 'one', traceparent => $1)`, goodTraceparent).Scan(&id); err != nil {
			return err
		}
		ids = append(ids, id)
		rows, err := tx.Query(b.ctx, `SELECT id FROM pgoutbox.enqueue_batch($1::text::json)`,
			`[{"queue": "q", "effect_type": "t", "idempotency_key": "two", "traceparent": "`+goodTraceparent+`"},
			  {"queue": "q", "effect_type": "t", "idempotency_key": "three", "traceparent": null},
			  {"queue": "q", "effect_type": "t", "idempotency_key": "four"}]`)
		if err != nil {
			return err
		}
		more, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		ids = append(ids, more...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		got := b.traceparent(t, id)
		if i < 2 && (got == nil || *got != goodTraceparent) || i >= 2 && got != nil {
			t.Errorf("effect %d: traceparent %s", i, orNull(got))
		}
	}

	bad := map[string]string{
		"upper case":      strings.ToUpper(goodTraceparent),
		"version ff":      "ff" + goodTraceparent[2:],
		"version 01":      "01" + goodTraceparent[2:],
		"zero trace id":   "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"zero parent id":  "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"trailing field":  goodTraceparent + "-00",
		"trailing line":   goodTraceparent + "\n",
		"empty":           "",
		"not hex":         "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
		"short":           goodTraceparent[:54],
		"one MiB":         goodTraceparent + strings.Repeat("a", 1<<20),
		"tracestate-like": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
	}
	before, keysBefore := b.count(t), b.keyRows(t)
	for name, tp := range bad {
		for _, call := range []struct {
			sql  string
			args []any
		}{
			{`SELECT pgoutbox.enqueue('q', 't', 'bad', traceparent => $1)`, []any{tp}},
			{`SELECT * FROM pgoutbox.enqueue_batch(json_build_array(json_build_object(
				'queue', 'q', 'effect_type', 't', 'idempotency_key', 'bad', 'traceparent', $1::text)))`, []any{tp}},
		} {
			err := b.execAs("pgoutbox_enqueuer", call.sql, call.args...)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "OB001" || pe.ColumnName != "traceparent" ||
				!strings.Contains(pe.Message, "traceparent must be NULL (none) or a W3C traceparent of version 00") ||
				len(pe.Message) > 300 {
				t.Errorf("%s, %.40s: %v, want OB001 on traceparent, without the value", name, call.sql, err)
			}
		}
	}
	err := b.execAs("pgoutbox_enqueuer", `SELECT * FROM pgoutbox.enqueue_batch('[{"queue": "q", "effect_type": "t", "idempotency_key": "bad", "traceparent": 7}]')`)
	if pgCode(err) != "OB001" || !strings.Contains(err.Error(), "traceparent must be a JSON string, not number") {
		t.Errorf("a number: %v", err)
	}
	// The table refuses one too, written directly by its owner.
	_, err = b.pool.Exec(b.ctx, `INSERT INTO pgoutbox.effects (queue, effect_type, idempotency_key, traceparent) VALUES ('q', 't', 'direct', 'x')`)
	if pgCode(err) != "23514" || !strings.Contains(err.Error(), "effects_traceparent_format") {
		t.Errorf("a direct insert: %v, want effects_traceparent_format violated", err)
	}
	if after, keysAfter := b.count(t), b.keyRows(t); after != before || keysAfter != keysBefore {
		t.Errorf("refusals wrote: effects %d → %d, key rows %d → %d", before, after, keysBefore, keysAfter)
	}

	// The delivery of the first effect continues the given trace.
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	seen := make(chan trace.SpanContext, len(ids))
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		SweepInterval: -1, PruneInterval: -1, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp,
		Queues: map[string]pgoutbox.QueueConfig{"q": {}},
		Types: []pgoutbox.EffectType{{Name: "t", ReplaySafe: true, Handler: func(ctx context.Context, d *pgoutbox.Delivery) error {
			if d.Key == "one" {
				seen <- trace.SpanContextFromContext(ctx)
			}
			return nil
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	var sc trace.SpanContext
	select {
	case sc = <-seen:
	case <-b.ctx.Done():
		t.Fatal("the effect was not delivered")
	}
	if err := c.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	if sc.TraceID().String() != goodTraceparent[3:35] {
		t.Errorf("the handler's span is in trace %s, want the given %s", sc.TraceID(), goodTraceparent[3:35])
	}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.SpanID() == sc.SpanID() && s.Parent.SpanID().String() != goodTraceparent[36:52] {
			t.Errorf("process span's parent %s, want %s", s.Parent.SpanID(), goodTraceparent[36:52])
		}
	}
}

// TestAnyLanguageTracingExample runs the tracing example of
// docs/any-language.md ("Tracing") statement by statement as the owner (a
// statement marked "-- refused: CODE" must be refused with that SQLSTATE),
// then delivers what it committed with a traced Client: the delivery's span
// is a child of the example's traceparent.
func TestAnyLanguageTracingExample(t *testing.T) {
	t.Parallel()
	b := setup(t)
	doc, err := os.ReadFile("docs/any-language.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, found := strings.Cut(string(doc), "<!-- tracing example -->\n```sql\n")
	block, _, closed := strings.Cut(after, "```")
	if !found || !closed {
		t.Fatal("docs/any-language.md has no tracing example block")
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	refusals := 0
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		sql, comment, _ := strings.Cut(line, "--")
		_, err := conn.Exec(b.ctx, strings.TrimSpace(sql))
		if want, refused := strings.CutPrefix(strings.TrimSpace(comment), "refused: "); refused {
			refusals++
			if pgCode(err) != want {
				t.Fatalf("%s: %v, want %s", sql, err, want)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	conn.Release()
	if n := b.count(t); n != 1 || refusals != 1 {
		t.Fatalf("%d effects, %d refusals; want the 1 committed and 1 refused", n, refusals)
	}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	c, err := pgoutbox.NewClient(b.pool, pgoutbox.Config{
		SweepInterval: -1, PruneInterval: -1, Logger: slog.New(slog.DiscardHandler), TracerProvider: tp,
		Queues: map[string]pgoutbox.QueueConfig{"emails": {}},
		Types: []pgoutbox.EffectType{{Name: "email.receipt", ReplaySafe: true,
			Handler: func(context.Context, *pgoutbox.Delivery) error { return nil }}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the example's effect completed", func() bool {
		return b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'completed'`) == 1
	})
	if err := c.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "process emails" ||
		spans[0].Parent.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" ||
		spans[0].Parent.SpanID().String() != "00f067aa0ba902b7" || !spans[0].Parent.IsRemote() {
		t.Fatalf("spans %v, want one \"process emails\", a child of the example's traceparent", spans)
	}
}
