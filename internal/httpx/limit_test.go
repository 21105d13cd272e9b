package httpx_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/httpx"
)

// TestGuessLimiterCountsBeforeComparing: 40 concurrent attempts from one
// client against a limit of 5, each comparison held open until every
// attempt has either started comparing or been refused, yield exactly 5
// comparisons; the 35 others are refused with the window's wait.
func TestGuessLimiterCountsBeforeComparing(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lim := httpx.NewGuessLimiter(5, time.Minute, func() time.Time { return now })
	const n = 40
	var settled sync.WaitGroup // each attempt: in its comparison, or refused
	settled.Add(n)
	release := make(chan struct{})
	go func() { settled.Wait(); close(release) }()
	var compared, refused atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			entered := false
			ok, wait := lim.Check("192.0.2.1", func() bool {
				entered = true
				compared.Add(1)
				settled.Done()
				<-release
				return false
			})
			if !entered {
				settled.Done()
			}
			if ok {
				t.Error("a wrong secret matched")
			}
			if wait == time.Minute {
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if compared.Load() != 5 || refused.Load() != n-5 {
		t.Fatalf("%d comparisons, %d refused with a minute to wait; want 5 and 35", compared.Load(), refused.Load())
	}
}

// TestGuessLimiterWindow: a right secret is compared, passes and gives its
// count back without forgiving the wrong ones; another client has its own
// budget; the window's end restores the budget.
func TestGuessLimiterWindow(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lim := httpx.NewGuessLimiter(3, time.Minute, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	right := func() bool { return true }
	wrong := func() bool { return false }
	for i := range 2 {
		if ok, wait := lim.Check("a", wrong); ok || wait != 0 {
			t.Fatalf("wrong %d: %v %v", i, ok, wait)
		}
	}
	for range 5 { // the right secret does not use up the budget
		if ok, _ := lim.Check("a", right); !ok {
			t.Fatal("right secret refused under the limit")
		}
	}
	advance(20 * time.Second)
	if ok, wait := lim.Check("a", wrong); ok || wait != 0 {
		t.Fatalf("third wrong: %v %v", ok, wait)
	}
	if ok, wait := lim.Check("a", right); ok || wait != 40*time.Second {
		t.Fatalf("right secret past the limit: %v, wait %v; want refused for 40s", ok, wait)
	}
	if ok, _ := lim.Check("b", right); !ok {
		t.Fatal("another client shares a's budget")
	}
	advance(40 * time.Second)
	if ok, _ := lim.Check("a", right); !ok {
		t.Fatal("right secret refused after the window")
	}
}
