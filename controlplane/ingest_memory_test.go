package controlplane_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/controlplane/webhook"
)

// heldBody is an unsigned post's body: size bytes of JSON-looking filler
// from a small buffer (the client holds no copy); the Read after the last
// byte reports the post as settled and waits for release before EOF, so
// the server holds whatever it buffered until every post has settled.
type heldBody struct {
	left    int64
	settle  func()
	release <-chan struct{}
}

var filler = []byte(strings.Repeat(" ", 32<<10))

func (b *heldBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		b.settle()
		<-b.release
		return 0, io.EOF
	}
	n := copy(p, filler[:min(int64(len(filler)), b.left)])
	b.left -= int64(n)
	return n, nil
}

// BenchmarkUnsignedWebhookBodies measures the heap the webhook endpoint
// holds while N posts of 25 MiB (GitHub's cap, the default body limit)
// with a well-formed but wrong X-Hub-Signature-256 are in flight at once:
// each post settles when the server has read its whole body (or answered
// it without reading it), and the live heap is taken when all have. No
// database is touched: every post is refused before one would be.
//
//	go test -run '^$' -bench BenchmarkUnsignedWebhookBodies -benchtime 3x ./controlplane/
func BenchmarkUnsignedWebhookBodies(b *testing.B) {
	for _, n := range []int{8, 32} {
		b.Run(fmt.Sprintf("posts=%d", n), func(b *testing.B) {
			app, err := controlplane.New(nil, controlplane.Config{WebhookSecret: []byte(secret)}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			mux := http.NewServeMux()
			app.Routes(mux)
			var peak uint64
			codes := map[int]int{}
			for b.Loop() {
				var base runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&base)
				var settled, done sync.WaitGroup
				settled.Add(n)
				release := make(chan struct{})
				recs := make([]*httptest.ResponseRecorder, n)
				for i := range n {
					once := new(sync.Once)
					settle := func() { once.Do(settled.Done) }
					body := &heldBody{left: controlplane.MaxBodyBytesDefault, settle: settle, release: release}
					r := httptest.NewRequest("POST", "/webhooks/github", body)
					r.Header.Set("Content-Type", "application/json")
					r.Header.Set(webhook.EventHeader, "check_run")
					r.Header.Set(webhook.DeliveryHeader, fmt.Sprintf("unsigned-%d", i))
					r.Header.Set(webhook.SignatureHeader, "sha256="+strings.Repeat("0", 64))
					recs[i] = httptest.NewRecorder()
					done.Go(func() {
						mux.ServeHTTP(recs[i], r)
						settle()
					})
				}
				settled.Wait()
				runtime.GC()
				var held runtime.MemStats
				runtime.ReadMemStats(&held)
				peak = max(peak, held.HeapAlloc-min(held.HeapAlloc, base.HeapAlloc))
				close(release)
				done.Wait()
				for _, w := range recs {
					codes[w.Code]++
				}
			}
			b.ReportMetric(float64(peak)/(1<<20), "MiB-held")
			b.ReportMetric(float64(peak)/float64(n)/(1<<20), "MiB-held/post")
			b.Logf("answers over %d rounds: %v", b.N, codes)
		})
	}
}

// unsignedPost is a post of size bytes with a wrong signature (or none,
// when sig is empty) whose body the server holds until release closes.
func unsignedPost(i int, size int64, sig string, settle func(), release <-chan struct{}) *http.Request {
	r := httptest.NewRequest("POST", "/webhooks/github", &heldBody{left: size, settle: settle, release: release})
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(webhook.EventHeader, "check_run")
	r.Header.Set(webhook.DeliveryHeader, fmt.Sprintf("unsigned-%d", i))
	if sig != "" {
		r.Header.Set(webhook.SignatureHeader, sig)
	}
	return r
}

// TestUnsignedBodiesShareABoundedBuffer: while two unsigned 25 MiB posts
// are held (read whole, not yet answered), a third one is answered 503
// with Retry-After once the buffer budget (64 MiB by default) is spent,
// instead of being buffered too; once they are answered (401) the budget
// is back. A post without a signature header is answered 401 before its
// body is read at all. No database is touched.
func TestUnsignedBodiesShareABoundedBuffer(t *testing.T) {
	t.Parallel()
	app, err := controlplane.New(nil, controlplane.Config{WebhookSecret: []byte(secret)}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	app.Routes(mux)
	wrong := "sha256=" + strings.Repeat("0", 64)
	release := make(chan struct{})
	var done sync.WaitGroup
	held := make([]*httptest.ResponseRecorder, 2)
	for i := range held {
		var settled sync.WaitGroup
		settled.Add(1)
		once := new(sync.Once)
		r := unsignedPost(i, controlplane.MaxBodyBytesDefault, wrong, func() { once.Do(settled.Done) }, release)
		held[i] = httptest.NewRecorder()
		done.Go(func() { mux.ServeHTTP(held[i], r); once.Do(settled.Done) })
		settled.Wait() // its whole body is read and held
	}
	open := make(chan struct{})
	close(open)
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, unsignedPost(2, controlplane.MaxBodyBytesDefault, wrong, func() {}, open))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("a third unsigned 25 MiB post while two are held: %d (Retry-After %q), want 503 with Retry-After",
			w.Code, w.Header().Get("Retry-After"))
	}
	close(release)
	done.Wait()
	for i, w := range held {
		if w.Code != http.StatusUnauthorized {
			t.Errorf("held post %d: %d, want 401", i, w.Code)
		}
	}
	w = httptest.NewRecorder()
	mux.ServeHTTP(w, unsignedPost(3, controlplane.MaxBodyBytesDefault, wrong, func() {}, open))
	if w.Code != http.StatusUnauthorized {
		t.Errorf("an unsigned post once the others are answered: %d, want 401", w.Code)
	}
	read := false
	w = httptest.NewRecorder()
	mux.ServeHTTP(w, unsignedPost(4, 1<<20, "", func() { read = true }, open))
	if w.Code != http.StatusUnauthorized || read {
		t.Errorf("a post without a signature: %d (body read to the end: %v), want 401 and the body unread", w.Code, read)
	}
}
