package httpx

import (
	"errors"
	"io"
	"sync"
)

// BodyChunk is the unit in which a Budget is taken: ReadBody reads into
// buffers of this size, each taken from the budget before it is allocated.
const BodyChunk = 32 << 10

// ErrBudgetSpent is returned by [Budget.ReadBody] when the budget cannot
// cover the body's next chunk: the request should be answered 503 with
// Retry-After. The chunks read so far are given back.
var ErrBudgetSpent = errors.New("httpx: request body buffer budget spent")

// Budget bounds the bytes that request bodies buffered in memory hold
// together (e.g. the webhook bodies not yet authenticated). It never
// waits: a body that does not fit is refused at once, so that requests
// holding part of the budget cannot wait for each other. It is safe for
// concurrent use.
type Budget struct {
	mu        sync.Mutex
	max, used int64
}

// NewBudget returns a budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max} }

func (b *Budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *Budget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// Held is a body read by [Budget.ReadBody]: its chunks, still accounted
// for in the budget until Release.
type Held struct {
	b      *Budget
	chunks [][]byte
	taken  int64
	n      int64
}

// Len is the body's size in bytes.
func (h *Held) Len() int64 { return h.n }

// Bytes joins the chunks into one slice (a copy: call it once the body is
// worth keeping, e.g. authenticated) and drops them.
func (h *Held) Bytes() []byte {
	body := make([]byte, 0, h.n)
	for _, c := range h.chunks {
		body = append(body, c...)
	}
	h.chunks = nil
	return body
}

// Release drops the chunks and gives their bytes back to the budget. Call
// it when the request is answered (the budget then also covers the copy
// Bytes made); a second call does nothing.
func (h *Held) Release() {
	h.chunks = nil
	h.b.give(h.taken)
	h.taken = 0
}

// ReadBody reads r to its end in BodyChunk buffers, taking each buffer's
// size from b before allocating it, and writes every piece read to tee
// (nil: none) as it arrives, e.g. a MAC. Bound r first (http.MaxBytesReader):
// ReadBody returns r's errors as they are, and [ErrBudgetSpent] when the
// next chunk does not fit; on error everything taken is given back.
// Memory is allocated only as bytes arrive, so a client holding part of
// the budget must have sent that many bytes.
func (b *Budget) ReadBody(r io.Reader, tee io.Writer) (*Held, error) {
	h := &Held{b: b}
	var probe [1]byte
	for {
		var n int
		var err error
		if len(h.chunks) == 0 || len(h.chunks[len(h.chunks)-1]) == BodyChunk {
			// A new chunk is taken only for a byte that arrived: a body
			// that ends on a chunk's boundary takes nothing more.
			if n, err = r.Read(probe[:]); n == 1 {
				if !b.take(BodyChunk) {
					h.Release()
					return nil, ErrBudgetSpent
				}
				h.taken += BodyChunk
				h.chunks = append(h.chunks, append(make([]byte, 0, BodyChunk), probe[0]))
			}
		} else {
			c := h.chunks[len(h.chunks)-1]
			n, err = r.Read(c[len(c):BodyChunk])
			h.chunks[len(h.chunks)-1] = c[:len(c)+n]
		}
		if n > 0 {
			c := h.chunks[len(h.chunks)-1]
			h.n += int64(n)
			if tee != nil {
				_, _ = tee.Write(c[len(c)-n:])
			}
		}
		if errors.Is(err, io.EOF) {
			return h, nil
		}
		if err != nil {
			h.Release()
			return nil, err
		}
	}
}
