package nats_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	pgnats "github.com/pgoutbox/pgoutbox/target/nats"
)

// The test binary doubles as a relay or consumer process: with childEnv
// set, TestMain runs childMain instead of the tests.
const (
	childEnv    = "PGOUTBOX_NATS_TEST_CHILD"
	childDSN    = "PGOUTBOX_NATS_TEST_DSN"
	childNATS   = "PGOUTBOX_NATS_TEST_URL"
	childTarget = "PGOUTBOX_NATS_TEST_TARGET"
	childArg    = "PGOUTBOX_NATS_TEST_ARG"
)

// Settings the parent and its children share.
const (
	killRelayBatch = 200
	childAckWait   = time.Second
)

// childMain is a relay or consumer process.
//
// Mode "relay" relays queue "q" in batches of killRelayBatch and prints
// "batch N" after the acks of each batch; on batch number childArg it prints
// "acked N" and hangs before handing the batch over, until it is killed.
//
// Mode "consume" consumes queue "q": the handlers of "safe" (replay-safe)
// and "dispatch" (not replay-safe) POST the key to the target URL, print
// "started <id> <type>" and hang until the process is killed.
func childMain() int {
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(childDSN))
	if err != nil {
		return fail(err)
	}
	defer pool.Close()
	nc, err := natsgo.Connect(os.Getenv(childNATS))
	if err != nil {
		return fail(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	switch os.Getenv(childEnv) {
	case "relay":
		hangAt, _ := strconv.Atoi(os.Getenv(childArg))
		batches := 0
		r, err := pgnats.NewRelay(pool, js, pgnats.RelayConfig{
			ID: "relay-child", Queues: []string{"q"}, Retry: testPolicy, Batch: killRelayBatch,
			AfterPublish: func(acked int) {
				batches++
				if batches == hangAt {
					fmt.Printf("acked %d\n", acked)
					select {} // until SIGKILL: published, not handed over
				}
				fmt.Printf("batch %d\n", acked)
			},
		})
		if err != nil {
			return fail(err)
		}
		if err := r.Start(ctx); err != nil {
			return fail(err)
		}
	case "consume":
		target := os.Getenv(childTarget)
		client := &http.Client{Timeout: 5 * time.Second}
		hang := func(_ context.Context, d *pgoutbox.Delivery) error {
			resp, err := client.Post(target+"/"+d.Key, "text/plain", nil)
			if err != nil {
				return pgoutbox.Retry(err)
			}
			resp.Body.Close()
			fmt.Printf("started %d %s\n", d.ID, d.Type)
			select {} // until SIGKILL: delivered, outcome never recorded
		}
		c, err := pgnats.NewConsumer(pool, js, pgnats.ConsumerConfig{
			ID: "consumer-child", Queues: map[string]pgoutbox.QueueConfig{"q": {Concurrency: 8, DeliveryTimeout: 500 * time.Millisecond}},
			Retry: testPolicy, AckWait: childAckWait,
			Types: []pgoutbox.EffectType{
				{Name: "safe", ReplaySafe: true, Handler: hang},
				{Name: "dispatch", Handler: hang},
			},
		})
		if err != nil {
			return fail(err)
		}
		if err := c.Start(ctx); err != nil {
			return fail(err)
		}
		fmt.Println("consuming")
	default:
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // run until killed or stdin closes
	return 0
}

type child struct {
	cmd    *exec.Cmd
	stdout *bufio.Scanner
}

func startChild(t interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // held open until the child is killed
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &child{cmd: cmd, stdout: bufio.NewScanner(out)}
}

// readUntil returns the first stdout line starting with prefix, or fails.
func (c *child) readUntil(t interface {
	Helper()
	Fatalf(string, ...any)
}, prefix string) string {
	t.Helper()
	for c.stdout.Scan() {
		if line := c.stdout.Text(); strings.HasPrefix(line, prefix) {
			return line
		}
	}
	t.Fatalf("child exited before printing %q: %v", prefix, c.stdout.Err())
	return ""
}
