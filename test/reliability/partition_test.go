package reliability

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
)

// faultMode is what the proxy does to one connection.
type faultMode int

const (
	modePass              faultMode = iota
	modeStall                       // accept, then never forward nor answer
	modeDelayShort                  // forward after 300 ms
	modeDelayLong                   // forward after 2.5 s (longer than the delivery timeout)
	modeResetBefore                 // RST before the request reaches the target
	modeResetAfterRequest           // the target handles the request; the client gets an RST instead of the answer
)

func (m faultMode) String() string {
	return [...]string{"pass", "stall", "delay_300ms", "delay_2500ms", "reset_before", "reset_after_request"}[m]
}

// proxy is a TCP proxy in front of a target that stalls, delays and resets
// the first faulty connections (in rotation through the fault modes), then
// passes every connection.
type proxy struct {
	ln      net.Listener
	backend string
	faulty  int64 // connections that get a fault

	seq    atomic.Int64
	closed chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]bool
	byMode [6]atomic.Int64
}

func newProxy(t *testing.T, backend string, faulty int64) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, backend: backend, faulty: faulty, closed: make(chan struct{}), conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
	}
	p.conns[c] = true
	return true
}

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		n := p.seq.Add(1)
		mode := modePass
		if n <= p.faulty {
			mode = faultMode(1 + (n-1)%5)
		}
		p.byMode[mode].Add(1)
		p.wg.Go(func() { p.handle(c, mode) })
	}
}

// close stops accepting, closes every connection and waits for every
// goroutine of the proxy.
func (p *proxy) close() {
	p.mu.Lock()
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0) // close sends RST
	}
	c.Close()
}

func (p *proxy) handle(c net.Conn, mode faultMode) {
	switch mode {
	case modeStall:
		_, _ = io.Copy(io.Discard, c) // until the client gives up
		c.Close()
		return
	case modeResetBefore:
		reset(c)
		return
	case modeDelayShort, modeDelayLong:
		d := 300 * time.Millisecond
		if mode == modeDelayLong {
			d = 2500 * time.Millisecond
		}
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-p.closed:
			timer.Stop()
			c.Close()
			return
		}
	}
	b, err := net.Dial("tcp", p.backend)
	if err != nil {
		reset(c)
		return
	}
	if !p.track(b) {
		c.Close()
		return
	}
	if mode == modeResetAfterRequest {
		// Forward one request, wait for the target's answer, then reset
		// the client instead of answering.
		p.wg.Go(func() { _, _ = io.Copy(b, c) })
		_, _ = bufio.NewReader(b).ReadByte()
		reset(c)
		b.Close()
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
	c.Close()
	b.Close()
	<-done
}

// Scenario 3: the target sits behind a proxy that stalls, delays and resets
// connections. Every call is bounded by its timeout, no lease expires under
// the live worker (the extender keeps them), a dispatch is never sent twice,
// and after the client stops the goroutines are back to the baseline.
func TestTargetPartitionThroughProxy(t *testing.T) {
	long(t)
	eachMode(t, testTargetPartition)
}

func testTargetPartition(t *testing.T, hold time.Duration) {
	ctx := timeout(t, 5*time.Minute)
	d := newDB(t)
	const (
		n            = 200
		faulty       = 60
		lease        = 2 * time.Second
		deliveryTime = 1500 * time.Millisecond
	)
	want := d.enqueue(t, ctx, spec{queue: "q", n: n, dispatchEvery: 10, keyPrefix: "k", maxAttempts: 50})
	baseline := runtime.NumGoroutine()
	ignore := goleak.IgnoreCurrent()

	var targetMu sync.Mutex
	received := map[int64]int{}
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.Header.Get("X-Effect-Id"), 10, 64)
		targetMu.Lock()
		received[id]++
		targetMu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok")
	}))
	px := newProxy(t, target.Listener.Addr().String(), faulty)
	transport := &http.Transport{DisableKeepAlives: true}
	hc := &http.Client{Transport: transport}

	var (
		durMu   sync.Mutex
		longest time.Duration
		peak    atomic.Int64
		callsN  atomic.Int64
	)
	handler := func(ctx context.Context, dl *pgoutbox.Delivery) error {
		callsN.Add(1)
		peak.Store(max(peak.Load(), int64(runtime.NumGoroutine())))
		start := time.Now()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+px.addr()+"/effects", nil)
		if err != nil {
			return pgoutbox.Permanent(err)
		}
		req.Header.Set("X-Effect-Id", strconv.FormatInt(dl.ID, 10))
		resp, err := hc.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		el := time.Since(start)
		durMu.Lock()
		longest = max(longest, el)
		durMu.Unlock()
		if err != nil {
			// The request may have reached the target: ambiguous (a retry
			// for replay-safe effects, reconciliation for a dispatch).
			return pgoutbox.Ambiguous(err)
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	client, err := pgoutbox.NewClient(d.pool, pgoutbox.Config{
		Queues:        withTestStorage(map[string]pgoutbox.QueueConfig{"q": {Concurrency: 8, DeliveryTimeout: deliveryTime, RowLockLease: hold}}),
		Types:         []pgoutbox.EffectType{{Name: typeSafe, ReplaySafe: true, Handler: handler}, {Name: typeDispatch, Handler: handler}},
		Registerer:    reg,
		LeaseDuration: lease,
		SweepInterval: 100 * time.Millisecond,
		PollInterval:  100 * time.Millisecond,
		BackoffCap:    200 * time.Millisecond,
		PruneInterval: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	events, unsubscribe := client.Subscribe(1 << 14)
	if err := client.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "every effect final", 50*time.Millisecond, func() bool {
		return d.scalar(t, ctx, terminalSQL) == n
	})
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	unsubscribe()
	leaseLost := 0
	for len(events) > 0 {
		if e := <-events; e.Outcome == pgoutbox.OutcomeLeaseLost {
			leaseLost++
		}
	}
	px.close()
	target.Close()
	transport.CloseIdleConnections()

	// Goroutines back to the baseline (goleak retries while they wind down).
	leakErr := goleak.Find(ignore)
	final := runtime.NumGoroutine()
	if leakErr != nil {
		t.Errorf("goroutines not back to the baseline of %d after stopping: %v", baseline, leakErr)
	}

	rescued := 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "pgoutbox_rescued_total" {
			for _, m := range mf.GetMetric() {
				rescued += m.GetCounter().GetValue()
			}
		}
	}
	if rescued != 0 || leaseLost != 0 {
		t.Errorf("%v leases recovered by the sweeper and %d lease-lost outcomes under a live worker; want 0", rescued, leaseLost)
	}
	if limit := deliveryTime + 500*time.Millisecond; longest > limit {
		t.Errorf("the longest call took %s, over the delivery timeout %s (+0.5 s)", longest, deliveryTime)
	}
	// The target's own view: a dispatch reached it at most once.
	targetMu.Lock()
	defer targetMu.Unlock()
	var calls []call
	for id, k := range received {
		for range k {
			calls = append(calls, call{id: id})
		}
	}
	l := account(t, ctx, d, want, calls, 0)
	if l.Lost != 0 || l.Unexpected != 0 || l.DispatchDuplicate != 0 || l.CompletedNoCall != 0 {
		t.Errorf("ledger: %+v", l.figures())
	}
	if faults := px.seq.Load(); faults < faulty {
		t.Fatalf("only %d connections reached the proxy; the partition was not exercised", faults)
	}
	f := l.figures()
	modes := map[string]int64{}
	for m := range px.byMode {
		modes[faultMode(m).String()] = px.byMode[m].Load()
	}
	f["connections_by_mode"] = modes
	f["handler_calls"] = callsN.Load()
	f["delivery_timeout_s"] = deliveryTime.Seconds()
	f["lease_s"] = lease.Seconds()
	f["longest_call_s"] = round(longest.Seconds())
	f["leases_recovered_by_sweeper"] = rescued
	f["lease_lost_outcomes"] = leaseLost
	f["goroutines_baseline"] = baseline
	f["goroutines_peak"] = peak.Load()
	f["goroutines_after_stop"] = final
	f["lease_mode"] = modeName(hold)
	report(t, "3 target partition via proxy", f)
}
