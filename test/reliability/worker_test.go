package reliability

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
)

// The test binary doubles as a worker process: with workerEnv set to a JSON
// workerSpec, TestMain runs workerMain instead of the tests.
const workerEnv = "PGOUTBOX_RELIABILITY_WORKER"

// Effect types every worker registers.
const (
	typeSafe     = "safe"     // replay-safe
	typeDispatch = "dispatch" // not replay-safe: delivery_started_at is committed first
)

// workerSpec configures one worker process.
type workerSpec struct {
	DSN         string        `json:"dsn"`
	Owner       string        `json:"owner"` // Config.ID, written to lease_owner
	Queue       string        `json:"queue"`
	Concurrency int           `json:"concurrency"`
	MaxConns    int32         `json:"max_conns"`
	Lease       time.Duration `json:"lease"`
	Sweep       time.Duration `json:"sweep"` // < 0: no sweeper in this worker
	Poll        time.Duration `json:"poll"`
	Timeout     time.Duration `json:"timeout"` // delivery timeout
	BackoffCap  time.Duration `json:"backoff_cap"`
	CallLog     string        `json:"call_log"` // the append-only call log
	LogFile     string        `json:"log_file"` // the engine's log (slog text)
	// Latency is the target's time per call.
	Latency time.Duration `json:"latency"`
	// PoisonKeys are keys whose every call fails (a retry).
	PoisonKeys []string `json:"poison_keys"`
	// Gate: each call prints "started <id> <type> <key>" and waits for a
	// "go" line on stdin (or its context's end). Keys starting with "fail-"
	// then fail, the others succeed.
	Gate bool `json:"gate"`
	// Events prints "event <id> <outcome> <state>" for every recorded
	// outcome.
	Events bool `json:"events"`
	// RowLock is the queue's QueueConfig.RowLockLease (negative: durable
	// leases; 0: the engine default).
	RowLock time.Duration `json:"row_lock"`
	// OrderLog, when set, is the ordered target's log (ordering_test.go):
	// an effect whose payload has an "okey" writes "S <tag> <okey> <ns>"
	// when its call starts and "E <tag> <okey> <ns>" when it succeeds; one
	// whose payload says "flaky" fails its first attempt (a retry).
	OrderLog string `json:"order_log"`
	// Storage is the queue's QueueConfig.Storage; empty: the test
	// matrix's (withTestStorage).
	Storage pgoutbox.Storage `json:"storage"`
}

// workerMain runs one worker process until its stdin closes (then stops
// gracefully) or it is killed.
func workerMain(raw string) int {
	var s workerSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "worker spec:", err)
		return 2
	}
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(s.DSN)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if s.MaxConns > 0 {
		pcfg.MaxConns = s.MaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	calls, err := os.OpenFile(s.CallLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer calls.Close()
	logOut := io.Discard
	if s.LogFile != "" {
		f, err := os.OpenFile(s.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		logOut = f
	}
	var orderLog *os.File
	if s.OrderLog != "" {
		if orderLog, err = os.OpenFile(s.OrderLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer orderLog.Close()
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	gate := make(chan struct{})
	var gateOnce sync.Once
	handler := func(ctx context.Context, d *pgoutbox.Delivery) error {
		// The call: one write(2) of one line to an O_APPEND file.
		token := d.LeaseToken
		if token == "" {
			token = "-" // a row-lock lease has no token
		}
		line := fmt.Sprintf("%d %d %s %s %d\n", d.ID, d.Attempt, token, d.Type, time.Now().UnixNano())
		if _, err := calls.Write([]byte(line)); err != nil {
			return pgoutbox.Retry(err)
		}
		if orderLog != nil {
			if err := orderedCall(orderLog, d, 'S'); err != nil {
				return err
			}
		}
		if s.Gate {
			say("started %d %s %s", d.ID, d.Type, d.Key)
			select {
			case <-gate:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			if strings.HasPrefix(d.Key, "fail-") {
				return pgoutbox.Retry(errors.New("target refused"))
			}
		}
		if s.Latency > 0 {
			t := time.NewTimer(s.Latency)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return context.Cause(ctx)
			}
		}
		if slices.Contains(s.PoisonKeys, d.Key) {
			return pgoutbox.Retry(errors.New("poisoned effect: the target rejects it every time"))
		}
		if orderLog != nil {
			return orderedCall(orderLog, d, 'E')
		}
		return nil
	}
	cfg := pgoutbox.Config{
		ID: s.Owner,
		Queues: withTestStorage(map[string]pgoutbox.QueueConfig{s.Queue: {Concurrency: s.Concurrency, DeliveryTimeout: s.Timeout,
			RowLockLease: s.RowLock, Storage: s.Storage}}),
		Types:         []pgoutbox.EffectType{{Name: typeSafe, ReplaySafe: true, Handler: handler}, {Name: typeDispatch, Handler: handler}},
		Logger:        slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: slog.LevelInfo})),
		LeaseDuration: s.Lease,
		SweepInterval: s.Sweep,
		PollInterval:  s.Poll,
		BackoffCap:    s.BackoffCap,
		PruneInterval: -1,
	}
	c, err := pgoutbox.NewClient(pool, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var evWG sync.WaitGroup
	quit := make(chan struct{})
	if s.Events {
		ch, done := c.Subscribe(1 << 16)
		evWG.Go(func() {
			defer done()
			for {
				select {
				case e := <-ch:
					say("event %d %s %s", e.EffectID, e.Outcome, e.State)
				case <-quit:
					for {
						select {
						case e := <-ch:
							say("event %d %s %s", e.EffectID, e.Outcome, e.State)
						default:
							return
						}
					}
				}
			}
		})
	}
	defer evWG.Wait()
	defer close(quit)
	if err := c.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	say("ready %s %d", s.Owner, os.Getpid())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "go" {
			gateOnce.Do(func() { close(gate) })
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// worker is a running worker process.
type worker struct {
	spec  workerSpec
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string   // its stdout, line by line; closed at EOF
	done  chan struct{} // closed when the process has exited and been reaped
	err   error         // its exit status, once done is closed
}

// startWorker starts a worker process and waits for its "ready" line.
func startWorker(t *testing.T, ctx context.Context, s workerSpec) *worker {
	t.Helper()
	if s.Concurrency == 0 {
		s.Concurrency = 8
	}
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{spec: s, cmd: cmd, stdin: stdin, lines: make(chan string, 1<<16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
		w.err = cmd.Wait() // after every read from the pipe
		close(w.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case a test left it stopped
		_ = cmd.Process.Kill()
		<-w.done
	})
	w.expect(t, ctx, "ready ")
	return w
}

// expect reads stdout lines until one starts with prefix and returns it.
func (w *worker) expect(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	for {
		select {
		case line, ok := <-w.lines:
			if !ok {
				<-w.done
				t.Fatalf("worker %s exited (%v) before printing %q", w.spec.Owner, w.err, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-ctx.Done():
			t.Fatalf("worker %s: no %q line before the deadline", w.spec.Owner, prefix)
		}
	}
}

// kill SIGKILLs the process and reaps it.
func (w *worker) kill(t *testing.T) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Drain stdout so that the reader reaches EOF and reaps the process.
	go func() {
		for range w.lines {
		}
	}()
	<-w.done
}

// stop closes stdin (a graceful stop) and waits for a zero exit.
func (w *worker) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	_ = w.stdin.Close()
	go func() {
		for range w.lines {
		}
	}()
	select {
	case <-w.done:
	case <-ctx.Done():
		t.Fatalf("worker %s did not stop", w.spec.Owner)
	}
	if w.err != nil {
		t.Fatalf("worker %s: %v", w.spec.Owner, w.err)
	}
}

// call is one line of a call log.
type call struct {
	id      int64
	attempt int
	token   string
	typ     string
	at      time.Time
	file    string
}

// readCalls reads every call log (*.calls) in dir. A torn last line (a
// process killed in the middle of a write) would be reported, not counted.
func readCalls(t *testing.T, dir string) (calls []call, torn int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.calls"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		c, n := readCallFile(t, f)
		calls, torn = append(calls, c...), torn+n
	}
	return calls, torn
}

// callsIn is the whole calls of one call log (a torn last line, from a
// killed writer, is left out).
func callsIn(t *testing.T, path string) []call {
	t.Helper()
	calls, _ := readCallFile(t, path)
	return calls
}

// readCallFile parses one call log; torn counts its lines that are cut or
// malformed.
func readCallFile(t *testing.T, f string) (calls []call, torn int) {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line == "" {
			continue
		}
		fs := strings.Fields(line)
		if !strings.HasSuffix(line, "\n") || len(fs) != 5 {
			torn++
			continue
		}
		id, err1 := strconv.ParseInt(fs[0], 10, 64)
		att, err2 := strconv.Atoi(fs[1])
		ns, err3 := strconv.ParseInt(fs[4], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			torn++
			continue
		}
		calls = append(calls, call{id: id, attempt: att, token: fs[2], typ: fs[3], at: time.Unix(0, ns), file: filepath.Base(f)})
	}
	return calls, torn
}

// ledger is the accounting of one run: SQL plus the call logs.
type ledger struct {
	Enqueued   int            `json:"enqueued"`
	States     map[string]int `json:"states"`
	Lost       int            `json:"lost"`       // not completed, dead_letter or reconciliation_required (or missing)
	Calls      int            `json:"calls"`      // target calls
	Unexpected int            `json:"unexpected"` // calls for ids never enqueued
	TornLines  int            `json:"torn_lines"`
	// Replay-safe duplicates: calls beyond one per effect, and the most
	// calls one effect received.
	SafeDuplicates    int `json:"safe_duplicates"`
	SafeMaxPerEffect  int `json:"safe_max_calls_per_effect"`
	DispatchDuplicate int `json:"dispatch_duplicates"` // must be 0
	// Started dispatches in reconciliation_required, by calls received.
	ReconcileOneCall int `json:"reconcile_with_one_call"`
	ReconcileNoCall  int `json:"reconcile_with_no_call"`
	// CompletedNoCall counts completed effects the target never saw (must
	// be 0).
	CompletedNoCall int `json:"completed_without_call"`

	dupIDs    []int64
	callsByID map[int64][]call
	stateByID map[int64]string
}

// account builds the ledger of the effects in want, expecting every one of
// them to be in a final or operator-visible state.
func account(t *testing.T, ctx context.Context, d *db, want enqueued, calls []call, torn int) ledger {
	t.Helper()
	l := ledger{Enqueued: len(want), States: map[string]int{}, Calls: len(calls), TornLines: torn,
		callsByID: map[int64][]call{}, stateByID: map[int64]string{}}
	rows, err := d.pool.Query(ctx, `SELECT id, state::text, delivery_started_at IS NOT NULL FROM pgoutbox.effect_states`)
	if err != nil {
		t.Fatal(err)
	}
	started := map[int64]bool{}
	for rows.Next() {
		var id int64
		var st string
		var s bool
		if err := rows.Scan(&id, &st, &s); err != nil {
			t.Fatal(err)
		}
		l.stateByID[id] = st
		started[id] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, c := range calls {
		if _, ok := want[c.id]; !ok {
			l.Unexpected++
			continue
		}
		l.callsByID[c.id] = append(l.callsByID[c.id], c)
	}
	for id, e := range want {
		st, ok := l.stateByID[id]
		if !ok {
			st = "missing"
		}
		l.States[st]++
		switch st {
		case "completed", "dead_letter", "reconciliation_required":
		default:
			l.Lost++
		}
		n := len(l.callsByID[id])
		if st == "completed" && n == 0 {
			l.CompletedNoCall++
		}
		if n > 1 {
			l.dupIDs = append(l.dupIDs, id)
		}
		switch e.typ {
		case typeDispatch:
			if n > 1 {
				l.DispatchDuplicate += n - 1
			}
			if st == "reconciliation_required" && started[id] {
				if n == 1 {
					l.ReconcileOneCall++
				} else if n == 0 {
					l.ReconcileNoCall++
				}
			}
		default:
			if n > 1 {
				l.SafeDuplicates += n - 1
			}
			l.SafeMaxPerEffect = max(l.SafeMaxPerEffect, n)
		}
	}
	slices.Sort(l.dupIDs)
	d.checkStorage(t, ctx)
	return l
}

// check fails the test on anything lost, unexpected or duplicated where no
// duplicate is allowed.
func (l ledger) check(t *testing.T) {
	t.Helper()
	if l.Lost != 0 || l.Unexpected != 0 || l.DispatchDuplicate != 0 || l.CompletedNoCall != 0 || l.TornLines != 0 {
		t.Errorf("ledger: lost %d, unexpected %d, dispatch duplicates %d, completed without a call %d, torn call-log lines %d; want 0 each (states %v)",
			l.Lost, l.Unexpected, l.DispatchDuplicate, l.CompletedNoCall, l.TornLines, l.States)
	}
}

func (l ledger) figures() figures {
	return figures{
		"enqueued": l.Enqueued, "states": l.States, "lost": l.Lost, "calls": l.Calls,
		"unexpected": l.Unexpected, "safe_duplicates": l.SafeDuplicates,
		"safe_max_calls_per_effect": l.SafeMaxPerEffect, "dispatch_duplicates": l.DispatchDuplicate,
		"reconcile_with_one_call": l.ReconcileOneCall, "reconcile_with_no_call": l.ReconcileNoCall,
	}
}

// tail returns the last n lines of a file, for failure messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
