package projection_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/solr"
	"github.com/pgoutbox/pgoutbox/projection"
)

// TestSolrReservedFieldNamesAreProjected: a record whose field names Solr
// reserves or refuses (_childDocuments_, "", a hyphen, a leading digit) is
// accepted by the records API and projected under solr.FieldName's names;
// the effect completes instead of dead-lettering on Solr's 400.
func TestSolrReservedFieldNamesAreProjected(t *testing.T) {
	t.Parallel()
	b, s := setupSolr(t, projection.Config{})
	if code, out := b.postJSON(t, "/api/records", `{"id":"odd","_childDocuments_":"plain","":"empty","date-created":"2026","1st":true,"title":"t"}`); code != 200 && code != 201 {
		t.Fatalf("post: %d %s", code, out)
	}
	leases, err := pgoutbox.ClaimLeases(b.ctx, b.pool, projection.Queue, "t", 10, time.Minute)
	if err != nil || len(leases) != 1 {
		t.Fatalf("claim: %v %d", err, len(leases))
	}
	if err := b.app.Handle(b.ctx, &leases[0].Delivery); err != nil {
		t.Fatalf("delivery: %v", err)
	}
	if err := leases[0].Complete(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	d := s.Doc(solrCore, "odd")
	for name, want := range map[string]any{"_childDocuments_": "plain", "": "empty", "date-created": "2026", "1st": true, "title": "t"} {
		if got := d[solr.FieldName(name)]; got != want {
			t.Errorf("field %q: Solr holds %v under %q, want %v", name, got, solr.FieldName(name), want)
		}
	}
	if n := b.scalar(t, `SELECT count(*) FROM pgoutbox.effects WHERE state <> 'completed'`); n != 0 {
		t.Fatalf("%d effects not completed", n)
	}
}
