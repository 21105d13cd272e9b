package projection_test

import (
	"encoding/json"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/adapters/sparql"
	"github.com/pgoutbox/pgoutbox/projection"
)

// TestSPARQLValuesRoundTripFromTheRecordsAPI: values that look like
// codepoint escapes and numbers beyond int64, posted to the records API,
// stored in PostgreSQL (jsonb) and projected, read back from Virtuoso as the
// same text and the same numbers.
func TestSPARQLValuesRoundTripFromTheRecordsAPI(t *testing.T) {
	t.Parallel()
	b, g := setupSPARQL(t, projection.Config{})
	strs := map[string]string{
		"esc4": `\u0022`, "esc8": `\U0001F600`, "path": `C:\new\table\u`, "ctrl": "\x01ABCD\x1f00000041",
		"emoji": "😀 Tête",
	}
	nums := map[string]string{ // field → exact value
		"big": "123456789012345678901234567890", "past64": "9223372036854775808", "neg": "-98765432109876543210",
		"dec": "1.50", "exp": "1500", "negexp": "-0.000025", "small": "42",
	}
	doc := map[string]any{"id": "vals"}
	for k, v := range strs {
		doc[k] = v
	}
	for k, v := range nums {
		doc[k] = json.Number(v)
	}
	doc["exp"], doc["negexp"] = json.Number("1.5e3"), json.Number("-2.5E-5")
	body, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	if code, out := b.postJSON(t, "/api/records", string(body)); code != 200 && code != 201 {
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
	rows, err := g.v.SelectTerms(b.ctx, fmt.Sprintf(`SELECT ?p ?o WHERE { GRAPH <%svals> { ?s ?p ?o } }`, g.prefix))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range rows {
		got[r["p"].Value] = r["o"].Value
	}
	for k, want := range strs {
		if v := got[sparql.FieldPrefixDefault+k]; v != want {
			t.Errorf("%s: Virtuoso holds %q, want %q", k, v, want)
		}
	}
	for k, want := range nums {
		x, ok1 := new(big.Rat).SetString(got[sparql.FieldPrefixDefault+k])
		y, _ := new(big.Rat).SetString(want)
		if !ok1 || x.Cmp(y) != 0 {
			t.Errorf("%s: Virtuoso holds %q, want the value %s", k, got[sparql.FieldPrefixDefault+k], want)
		}
	}
}
