package loopback

import (
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Close lets the request in flight finish (its client gets the whole
// answer), returns only after it has, refuses new connections, and may be
// called twice. goleak (TestMain) checks it leaves no goroutine behind.
func TestCloseWaitsForRequestsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	s := Start(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		_, _ = io.WriteString(w, "done")
		finished.Store(true)
	}))
	// Release the handler only once Close has begun shutting down.
	var once sync.Once
	s.srv.RegisterOnShutdown(func() { once.Do(func() { close(release) }) })
	got := make(chan string, 1)
	go func() {
		resp, err := s.Client().Get(s.URL + "/")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(b)
	}()
	<-entered
	s.Close()
	if !finished.Load() {
		t.Fatal("Close returned before the request in flight finished")
	}
	if g := <-got; g != "done" {
		t.Fatalf("the request in flight got %q, want its whole answer", g)
	}
	if _, err := http.Get(s.URL + "/"); err == nil {
		t.Fatal("a closed server still accepts requests")
	}
	s.Close()
}
