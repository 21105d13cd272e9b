package projection_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/projection"
)

// panicTarget panics on every projection.
type panicTarget struct{}

func (panicTarget) Name() string { return projection.TargetSolr }
func (panicTarget) Project(context.Context, projection.Record, map[string]any) error {
	panic("target exploded")
}

// A target that panics fails its delivery like any error (a retry, attempt
// counted); it does not crash the projector's batch or the process, which
// the batch did before it ran on the engine's deliverer.
func TestProjectorBatchSurvivesHandlerPanic(t *testing.T) {
	t.Parallel()
	b, _ := setupSolr(t, projection.Config{})
	b.app.WithTargets(panicTarget{})
	b.importN(t, 1, "Boom")
	sum, err := b.app.RunBatch(b.ctx, 10)
	if err != nil || sum.Claimed != 1 || sum.Retried != 1 || sum.Projected != 0 {
		t.Fatalf("batch: %v %+v", err, sum)
	}
	if len(sum.LastErrors) != 1 || !strings.Contains(sum.LastErrors[0], "handler panic: target exploded") {
		t.Fatalf("errors %q, want the panic", sum.LastErrors)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state = 'available' AND attempts = 1 AND last_error LIKE 'handler panic%'`); n != 1 {
		t.Fatalf("%d effects retrying with the panic recorded, want 1", n)
	}
}

// RunBatch records record.upsert's ordering choice (a dead letter lets the
// record's later versions through) before its first claim, as a Client does
// at start: claimers read it from pgoutbox.ordering_choices.
func TestProjectorRecordsOrderingChoice(t *testing.T) {
	t.Parallel()
	b, _ := setupSolr(t, projection.Config{})
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.ordering_choices WHERE effect_type = 'record.upsert'`); n != 0 {
		t.Fatalf("%d ordering_choices rows before the first batch, want 0", n)
	}
	if _, err := b.app.RunBatch(b.ctx, 10); err != nil {
		t.Fatal(err)
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.ordering_choices
		WHERE queue = $1 AND effect_type = 'record.upsert' AND dead_letter_moves_on`, projection.Queue); n != 1 {
		t.Fatalf("%d ordering_choices rows letting record.upsert move on in its queue after a batch, want 1", n)
	}
}
