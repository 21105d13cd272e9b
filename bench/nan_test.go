package main

import (
	"encoding/json"
	"math"
	"testing"
)

// TestResultJSONNaN: a figure that is NaN (not measured) is written as null
// and read back as NaN; encoding/json alone refuses NaN, and -json would
// then write nothing.
func TestResultJSONNaN(t *testing.T) {
	b, err := json.Marshal(rawResult{Figures: result{"a": 1.5, "hot": math.NaN()}})
	if err != nil {
		t.Fatal(err)
	}
	var back rawResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Figures["a"] != 1.5 || !math.IsNaN(back.Figures["hot"]) {
		t.Fatalf("round trip of %s: %v", b, back.Figures)
	}
}
