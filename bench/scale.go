package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/benchrun"
)

// The scale scenario runs the workers in separate processes: this binary
// re-executed with -child. Protocol on the child's stdin/stdout, one line each:
//
//	child -> parent  "ready"          client built, backlog visible
//	parent -> child  "go"             start working
//	child -> parent  "done N"         N completions so far (every 10 ms when changed)
//	parent closes stdin               stop
//	child -> parent  "cpu SECONDS"    CPU used between "go" and stop

func runScale(ctx context.Context, e *env) (result, error) {
	n := e.o.scaleN
	// Insert with a throwaway client (not started).
	ins, err := e.sys.Prepare(ctx, e.pool, workerConfig{workers: 1})
	if err != nil {
		return nil, err
	}
	if err := benchrun.InsertBacklog(ctx, e.prod, ins, n, e.o.insertBatch, nil); err != nil {
		return nil, err
	}
	flushStats(e.prod, e.pool)
	st0, err := readStats(ctx, e.pool, e.sys.Tables()[0])
	if err != nil {
		return nil, err
	}
	d, err := drainChildren(ctx, e, n, e.o.scaleProcs, e.o.scaleWorkers, nil)
	if err != nil {
		return nil, err
	}
	flushStats(e.pool)
	st1, err := readStats(ctx, e.pool, e.sys.Tables()[0])
	if err != nil {
		return nil, err
	}
	return result{
		"effects_per_s": float64(n) / d.elapsed.Seconds(),
		"xacts":         (st1.xacts - st0.xacts) / float64(n) * 1000,
		"cpu_proc":      d.cpu / float64(n) * 10000,
	}, nil
}

// childDrain is what drainChildren measured.
type childDrain struct {
	elapsed time.Duration
	cpu     float64 // CPU seconds of all worker processes between "go" and stop
	rssKB   float64 // the largest peak RSS (VmHWM) of any worker process
}

// drainChildren starts procs worker processes of e.sys with workers workers
// each, lets them drain the n effects already in the database, and stops
// them. drained, when set, runs once the n effects are completed and before
// the processes stop (their backends' CPU is counted only while they live).
func drainChildren(ctx context.Context, e *env, n, procs, workers int, drained func()) (childDrain, error) {
	var out childDrain
	exe, err := os.Executable()
	if err != nil {
		return out, err
	}
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
		done  int64
		cpu   float64
		rss   float64
	}
	var kids []*child
	defer func() {
		for _, k := range kids {
			if k.cmd.Process != nil && k.cmd.ProcessState == nil {
				_ = k.cmd.Process.Kill()
				_ = k.cmd.Wait()
			}
		}
	}()
	for i := range procs {
		args := []string{
			"-child", e.sys.Name(), "-dsn", e.dsn,
			"-workers", strconv.Itoa(workers),
			"-pool-conns", strconv.Itoa(e.o.poolConns),
			"-payload-bytes", strconv.Itoa(e.o.payloadBytes),
			"-pg-claim-batch", strconv.Itoa(e.o.pg.claimBatch),
			"-pg-completion-batch", strconv.Itoa(e.o.pg.completionBatch),
			"-pg-poll", e.o.pg.poll.String(),
			"-pg-clients", "1",
			"-pg-row-lock", e.o.pg.rowLock.String(),
			"-pg-claim-cooldown", e.o.pg.claimCooldown.String(),
			"-pgq-ticker", e.o.pgqTicker.String(),
			"-ceiling-loops", strconv.Itoa(e.o.ceilingLoops),
			"-ceiling-batch", strconv.Itoa(e.o.ceilingBatch),
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return out, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return out, err
		}
		if err := cmd.Start(); err != nil {
			return out, fmt.Errorf("child %d: %w", i, err)
		}
		k := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 1024)}
		kids = append(kids, k)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				k.lines <- sc.Text()
			}
			close(k.lines)
		}()
	}
	expect := func(k *child, prefix string) (string, error) {
		select {
		case l, ok := <-k.lines:
			if !ok {
				return "", fmt.Errorf("child exited before %q", prefix)
			}
			if !strings.HasPrefix(l, prefix) {
				return "", fmt.Errorf("child said %q, want %q", l, prefix)
			}
			return strings.TrimSpace(strings.TrimPrefix(l, prefix)), nil
		case <-time.After(time.Minute):
			return "", fmt.Errorf("child: no %q after 1m", prefix)
		}
	}
	for _, k := range kids {
		if _, err := expect(k, "ready"); err != nil {
			return out, err
		}
	}
	start := time.Now()
	for _, k := range kids {
		if _, err := io.WriteString(k.stdin, "go\n"); err != nil {
			return out, err
		}
	}
	// Merge progress until the sum reaches n.
	var mu sync.Mutex
	reached := make(chan struct{})
	var once sync.Once
	var cpuWG sync.WaitGroup
	for _, k := range kids {
		cpuWG.Add(1)
		go func() {
			defer cpuWG.Done()
			for l := range k.lines {
				f := strings.Fields(l)
				if len(f) != 2 {
					continue
				}
				v, _ := strconv.ParseFloat(f[1], 64)
				mu.Lock()
				switch f[0] {
				case "done":
					k.done = int64(v)
					var sum int64
					for _, kk := range kids {
						sum += kk.done
					}
					if sum >= int64(n) {
						once.Do(func() { close(reached) })
					}
				case "cpu":
					k.cpu = v
				case "rss":
					k.rss = v
				}
				mu.Unlock()
			}
		}()
	}
	select {
	case <-reached:
	case <-time.After(e.o.timeout):
		return out, fmt.Errorf("not drained after %s", e.o.timeout)
	}
	out.elapsed = time.Since(start)
	if drained != nil {
		drained()
	}
	for _, k := range kids {
		_ = k.stdin.Close()
	}
	cpuWG.Wait()
	for _, k := range kids {
		if err := k.cmd.Wait(); err != nil {
			return out, fmt.Errorf("child: %w", err)
		}
		out.cpu += k.cpu
		out.rssKB = max(out.rssKB, k.rss)
	}
	return out, nil
}

// peakRSSKB is this process's peak resident set size (VmHWM) in KB.
func peakRSSKB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return math.NaN()
	}
	for l := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err == nil {
				return v
			}
		}
	}
	return math.NaN()
}

// childMain is the worker process of the scale scenario.
func childMain(o *options, sys system) error {
	ctx := context.Background()
	pool, err := benchrun.OpenPool(ctx, o.dsn, o.poolConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := sys.Prepare(ctx, pool, workerConfig{workers: o.workers})
	if err != nil {
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, a ...any) {
		fmt.Fprintf(out, format+"\n", a...)
		_ = out.Flush()
	}
	say("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return fmt.Errorf("child: expected go")
	}
	cpu0 := benchrun.ProcessCPU()
	if err := r.Start(ctx); err != nil {
		return err
	}
	stop := make(chan struct{})
	go func() {
		for in.Scan() {
		}
		close(stop)
	}()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var last int64 = -1
	for running := true; running; {
		select {
		case <-stop:
			running = false
		case <-t.C:
		}
		if v := r.Completed().Load(); v != last {
			last = v
			say("done %d", v)
		}
	}
	cpu := benchrun.ProcessCPU() - cpu0
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = r.Stop(stopCtx)
	say("cpu %.3f", cpu.Seconds())
	say("rss %.0f", peakRSSKB())
	return err
}
