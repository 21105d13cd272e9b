package httpx_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// TestBudgetReadBody: bodies are held within the budget, chunk by chunk
// as they arrive, teed whole; one that does not fit is refused and gives
// back what it took; Release returns the rest.
func TestBudgetReadBody(t *testing.T) {
	t.Parallel()
	b := httpx.NewBudget(3 * httpx.BodyChunk)
	one := bytes.Repeat([]byte("a"), httpx.BodyChunk+7) // two chunks
	sum := sha256.New()
	h1, err := b.ReadBody(bytes.NewReader(one), sum)
	if err != nil || h1.Len() != int64(len(one)) {
		t.Fatalf("first body: %v, %d bytes", err, h1.Len())
	}
	if want := sha256.Sum256(one); !bytes.Equal(sum.Sum(nil), want[:]) {
		t.Fatal("the tee did not see the body whole")
	}
	exact := bytes.Repeat([]byte("b"), httpx.BodyChunk) // one chunk: the EOF's chunk is given back
	h2, err := b.ReadBody(bytes.NewReader(exact), nil)
	if err != nil {
		t.Fatalf("a body of one chunk with one chunk left: %v", err)
	}
	if _, err := b.ReadBody(bytes.NewReader([]byte("c")), nil); !errors.Is(err, httpx.ErrBudgetSpent) {
		t.Fatalf("a body past the budget: %v, want ErrBudgetSpent", err)
	}
	if got := h2.Bytes(); !bytes.Equal(got, exact) {
		t.Fatal("Bytes changed the body")
	}
	h2.Release()
	h2.Release() // a second call gives nothing back twice
	if _, err := b.ReadBody(bytes.NewReader(one), nil); !errors.Is(err, httpx.ErrBudgetSpent) {
		t.Fatalf("two chunks with one free: %v, want ErrBudgetSpent (a refused read gives back what it took)", err)
	}
	h1.Release()
	h3, err := b.ReadBody(bytes.NewReader(bytes.Repeat([]byte("d"), 3*httpx.BodyChunk)), nil)
	if err != nil {
		t.Fatalf("the whole budget once everything is released: %v", err)
	}
	h3.Release()
}
