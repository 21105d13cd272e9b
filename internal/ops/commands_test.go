package ops_test

// The operator commands, run as the real pgoutbox binary against a seeded
// database: output, --json parsed back, exit codes, environment variables.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/pgoutbox/pgoutbox/internal/ops"
)

type result struct {
	code           int
	stdout, stderr string
}

// cleanEnv is the test process's environment without the variables the
// commands read, so that only what a test sets applies.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "OUTBOX_") || strings.HasPrefix(name, "PGOUTBOX_") || name == "DATABASE_URL" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// run executes the binary with --database-url set to the test's database
// and extra environment variables.
func (b *bundle) run(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.CommandContext(b.ctx, binary(t), append([]string{"--database-url", b.dsn}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// runJSON runs a command with --json, expects exit code want and decodes
// stdout into v.
func (b *bundle) runJSON(t *testing.T, env []string, want int, v any, args ...string) result {
	t.Helper()
	r := b.run(t, env, append(args, "--json")...)
	if r.code != want {
		t.Fatalf("%v: exit %d, want %d\nstdout: %s\nstderr: %s", args, r.code, want, r.stdout, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("%v: not JSON: %v\n%s", args, err, r.stdout)
	}
	return r
}

// columnsAligned checks that every line of a table starts its cells at the
// header's column positions.
func columnsAligned(t *testing.T, table string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	starts := func(line string) []int {
		var out []int
		for _, m := range regexp.MustCompile(`(^|  )\S`).FindAllStringIndex(line, -1) {
			out = append(out, m[1]-1)
		}
		return out
	}
	head := starts(lines[0])
	for _, l := range lines[1:] {
		got := starts(l)
		for i, s := range got {
			if i < len(head) && s != head[i] {
				t.Fatalf("misaligned table:\n%s", table)
			}
		}
	}
}

func TestCommandStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	binary(t) // built before the seed: the ages below count from it
	seed(t, b.ctx, b.pool,
		eff{queue: "mail", typ: "email.send", state: "available", availableAgo: 754},
		eff{queue: "mail", typ: "email.send", state: "available", attempts: 3, availableAgo: -60},
		eff{queue: "mail", typ: "email.send", state: "leased", attempts: 1, leasedAgo: 700},
		eff{queue: "mail", typ: "email.send", state: "completed", attempts: 1, createdAgo: 4, completedAgo: 1},
		eff{queue: "gh", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 60, started: true},
		eff{queue: "gh", typ: "github.check_run.create", state: "dead_letter", attempts: 8, completedAgo: 5},
	)
	var snap ops.Snapshot
	b.runJSON(t, nil, 0, &snap, "status")
	if len(snap.Queues) != 2 {
		t.Fatalf("%+v", snap)
	}
	gh, mail := snap.Queues[0], snap.Queues[1]
	if gh.Queue != "gh" || gh.DeadLetter != 1 || gh.ReconciliationRequired != 1 || gh.Available != 0 {
		t.Fatalf("gh: %+v", gh)
	}
	if mail.Available != 2 || mail.Retrying != 1 || mail.Leased != 1 || mail.StalledLeases != 1 || mail.CompletedRecent != 1 ||
		mail.LagP50Seconds == nil || *mail.LagP50Seconds != 3 ||
		mail.OldestAvailableAgeSeconds < 754 || mail.OldestAvailableAgeSeconds > 784 {
		t.Fatalf("mail: %+v", mail)
	}
	if len(snap.Types) != 3 {
		t.Fatalf("types: %+v", snap.Types)
	}

	// The stalled age comes from the environment, in minutes.
	b.runJSON(t, []string{"OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES=12"}, 0, &snap, "status", "--queue", "mail")
	if len(snap.Queues) != 1 || snap.Queues[0].StalledLeases != 0 || snap.StalledAfterSeconds != 720 {
		t.Fatalf("stalled after 12 min: %+v", snap)
	}

	r := b.run(t, nil, "status")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	table := r.stdout[:strings.Index(r.stdout, "oldest transaction")]
	columnsAligned(t, table)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^QUEUE +AVAILABLE +RETRYING +PARKED +LEASED +STALLED +DEAD LETTER +RECONCILIATION +COMPLETED IN THE LAST 5 MIN +OLDEST AVAILABLE +LAG P50 +LAG P99$`),
		regexp.MustCompile(`(?m)^gh +0 +0 +0 +0 +0 +1 +1 +0 +0s +- +-$`),
		regexp.MustCompile(`(?m)^mail +2 +1 +0 +1 +1 +0 +0 +1 +12m(3[4-9]|[45]\d)s +3s +3s$`),
		regexp.MustCompile(`(?m)^TOTAL +2 +1 +0 +1 +1 +1 +1 +1 +12m`),
		regexp.MustCompile(`(?m)^oldest transaction holding back VACUUM: 0s$`),
	} {
		if !want.MatchString(r.stdout) {
			t.Errorf("status output does not match %s:\n%s", want, r.stdout)
		}
	}
	r = b.run(t, nil, "status", "--by-type", "--effect-type", "github.check_run.create")
	if r.code != 0 || !regexp.MustCompile(`(?m)^gh +github.check_run.create +0 +0 +0 +0 +0 +1 +0 `).MatchString(r.stdout) {
		t.Fatalf("--by-type: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func TestCommandDLQ(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 5, lastError: "HTTP 500\n\x1b[31mred\x1b[0m\tdone"},
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 2, maxAttempts: 2, completedAgo: 4, lastError: "boom"},
		eff{queue: "gh", typ: "github.workflow.dispatch", state: "reconciliation_required", attempts: 1, leasedAgo: 60, started: true},
	)
	var page ops.DeadLetterPage
	b.runJSON(t, nil, 0, &page, "dlq", "list", "--limit", "1")
	if len(page.Items) != 1 || page.Items[0].ID != ids[0] || page.NextAfterID == nil || *page.NextAfterID != ids[0] ||
		page.Items[0].LastError != "HTTP 500\n\x1b[31mred\x1b[0m\tdone" {
		t.Fatalf("page: %+v", page)
	}
	r := b.run(t, nil, "dlq", "list")
	if r.code != 0 || strings.ContainsAny(r.stdout, "\x1b\t") ||
		!regexp.MustCompile(`(?m)^ID +QUEUE +EFFECT TYPE +SUBJECT +ATTEMPTS +DEAD-LETTERED AT +LAST ERROR\n\d+ +q +t +- +8/8 +\d{4}-\d\d-\d\dT\S+Z +HTTP 500 \[31mred \[0m done\n\d+ +q +t +- +2/2 .* boom$`).MatchString(r.stdout) {
		t.Fatalf("dlq list: %d\n%q", r.code, r.stdout)
	}
	columnsAligned(t, r.stdout)

	// Replay needs a selection.
	if r := b.run(t, nil, "dlq", "replay"); r.code != 1 || !strings.Contains(r.stderr, "--all") {
		t.Fatalf("replay without a selection: %d %s", r.code, r.stderr)
	}
	// A reconciliation record is refused, by id, and left unchanged.
	recon := b.rowJSON(t, ids[2])
	r = b.run(t, nil, "dlq", "replay", "--id", itoa(ids[2]))
	if r.code != 1 || !strings.Contains(r.stderr, "reconciliation records are never replayed") || b.rowJSON(t, ids[2]) != recon {
		t.Fatalf("replay of a reconciliation record: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The batch limit comes from OUTBOX_REPLAY_BATCH_LIMIT.
	var res ops.ReplayResult
	b.runJSON(t, []string{"OUTBOX_REPLAY_BATCH_LIMIT=1"}, 0, &res, "dlq", "replay", "--all")
	if res.Limit != 1 || len(res.Replayed) != 1 || res.Replayed[0].ID != ids[0] || res.Replayed[0].State != "available" {
		t.Fatalf("replay: %+v", res)
	}
	r = b.run(t, nil, "dlq", "replay", "--all")
	if r.code != 0 || !strings.Contains(r.stdout, "replayed 1 dead letter(s)") || b.state(t, ids[1]) != "available" ||
		b.rowJSON(t, ids[2]) != recon {
		t.Fatalf("replay --all: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

func itoa(id int64) string {
	b, _ := json.Marshal(id)
	return string(b)
}

func TestCommandRequeueStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "gh", typ: "github.workflow.dispatch", state: "leased", attempts: 1, leasedAgo: 11 * 60, started: true},
		eff{queue: "gh", typ: "github.check_run.create", state: "leased", attempts: 1, leasedAgo: 11 * 60},
	)
	// With a 20-minute stalled age from the environment, nothing is stalled.
	var res ops.RequeueResult
	b.runJSON(t, []string{"OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES=20"}, 0, &res, "requeue-stale")
	if len(res.Requeued) != 0 || res.StalledAfterSeconds != 1200 {
		t.Fatalf("%+v", res)
	}
	r := b.run(t, nil, "requeue-stale")
	if r.code != 0 || b.state(t, ids[0]) != "reconciliation_required" || b.state(t, ids[1]) != "available" ||
		!strings.Contains(r.stdout, "requeued 2 stalled lease(s) held longer than 10m0s: 1 available, 1 reconciliation_required") ||
		!regexp.MustCompile(`(?m)^\d+ +gh +github.workflow.dispatch +seed-worker +11m\d+s +reconciliation_required$`).MatchString(r.stdout) {
		t.Fatalf("requeue-stale: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// webhook is an alert receiver that records what it was sent.
func webhook(t *testing.T) (*httptest.Server, chan ops.WebhookAlert) {
	t.Helper()
	got := make(chan ops.WebhookAlert, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var a ops.WebhookAlert
		if err := json.NewDecoder(r.Body).Decode(&a); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got <- a
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

func TestCommandAlertCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	srv, got := webhook(t)
	hook := "OUTBOX_ALERT_WEBHOOK_URL=" + srv.URL + "/hooks/T0-SECRET"

	// Nothing wrong: exit 0 even when failing on alerts, nothing posted.
	r := b.run(t, []string{hook, "OUTBOX_ALERT_FAIL_ON_ALERT=1"}, "alert", "check")
	if r.code != 0 || !strings.Contains(r.stdout, "no alert") || len(got) != 0 {
		t.Fatalf("clean: %d posted=%d\n%s%s", r.code, len(got), r.stdout, r.stderr)
	}
	columnsAligned(t, r.stdout[:strings.Index(r.stdout, "no alert")])

	seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 1})
	// A breach without OUTBOX_ALERT_FAIL_ON_ALERT: reported and posted, exit 0.
	r = b.run(t, []string{hook}, "alert", "check")
	if r.code != 0 || !regexp.MustCompile(`(?m)^dead_letters +1 +>= 1 +ALERT$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^pending_age +0s +>= 15m0s +ok$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^xmin_age +0s +>= 5m0s +ok$`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "alert posted") {
		t.Fatalf("breach: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if a := <-got; a.Status != "firing" || len(a.Firing) != 1 || a.Firing[0].Rule != ops.RuleDeadLetters {
		t.Fatalf("posted: %+v", a)
	}
	// With OUTBOX_ALERT_FAIL_ON_ALERT=1: exit 3.
	var out struct {
		ops.AlertReport
		Webhook struct{ Configured, Posted bool }
	}
	b.runJSON(t, []string{hook, "OUTBOX_ALERT_FAIL_ON_ALERT=1"}, 3, &out, "alert", "check")
	if !out.Firing || !out.Webhook.Configured || !out.Webhook.Posted || len(out.Rules) != 7 {
		t.Fatalf("json: %+v", out)
	}
	<-got
	// OUTBOX_ALERT_FAIL_ON_ALERT other than 1 does not fail.
	if r := b.run(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=true"}, "alert", "check"); r.code != 0 {
		t.Fatalf("FAIL_ON_ALERT=true: exit %d", r.code)
	}
	// Thresholds come from the environment: 2 dead letters needed.
	if r := b.run(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1", "OUTBOX_DLQ_ALERT_THRESHOLD=2"}, "alert", "check"); r.code != 0 ||
		!regexp.MustCompile(`(?m)^dead_letters +1 +>= 2 +ok$`).MatchString(r.stdout) {
		t.Fatalf("threshold 2: %d\n%s", r.code, r.stdout)
	}
	// An unreachable webhook is reported, without its URL, and does not
	// change the exit code.
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	r = b.run(t, []string{"OUTBOX_ALERT_WEBHOOK_URL=" + deadURL + "/hooks/T0-SECRET", "OUTBOX_ALERT_FAIL_ON_ALERT=1"}, "alert", "check")
	if r.code != 3 || !strings.Contains(r.stderr, "alert webhook") || strings.Contains(r.stdout+r.stderr, "T0-SECRET") {
		t.Fatalf("unreachable webhook: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if len(got) != 0 {
		t.Fatal("unexpected post")
	}
}

func TestCommandReadinessBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var rep ops.BrokerReport
	b.runJSON(t, nil, 0, &rep, "readiness", "broker", "--check")
	if rep.Decision != ops.DecisionInsufficientSamples {
		t.Fatalf("%+v", rep)
	}
	b.sampleSeries(t, "gh", "w1", 90, func(int) (*float64, float64, float64, bool) { return ms(420), 1, 50, true })
	r := b.run(t, nil, "readiness", "broker")
	if r.code != 0 ||
		!regexp.MustCompile(`(?m)^claim_latency_p99 +gh +> 250ms +15/15 +420ms +420ms +420ms +PERSISTED$`).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^throughput +\(all queues\) +> 500.0/s +0/15 +50.0/s +50.0/s +50.0/s +ok$`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "decision: consider_broker: claim_latency_p99 on gh stayed above 250ms") {
		t.Fatalf("broker: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	b.runJSON(t, nil, 3, &rep, "readiness", "broker", "--check")
	if rep.Decision != ops.DecisionConsiderBroker {
		t.Fatalf("%+v", rep)
	}
	b.runJSON(t, nil, 0, &rep, "readiness", "broker", "--check", "--queue", "other")
	if rep.Decision != ops.DecisionInsufficientSamples {
		t.Fatalf("other queue: %+v", rep)
	}
}

// TestCommandFiltersAreLiteral passes SQL-injection strings to every filter
// flag of every command: each is compared literally (nothing matches), every
// command succeeds (dlq replay says the filter matches nothing: exit 1), and
// no table changes.
func TestCommandFiltersAreLiteral(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool,
		eff{queue: "q", typ: "t", state: "available", availableAgo: 3600},
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 8, completedAgo: 5},
		eff{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 3600},
		eff{queue: "q", typ: "t", state: "reconciliation_required", attempts: 1, leasedAgo: 60, started: true},
	)
	b.sampleSeries(t, "q", "w", 90, calm)
	before := b.fingerprint(t)
	injections := []string{
		"q' OR '1'='1",
		"'; DROP TABLE pgoutbox.effects; --",
		`q"; DELETE FROM pgoutbox.samples; --`,
		"q' UNION SELECT 1 --",
		"$1",
		"%",
		`\'`,
	}
	commands := [][]string{
		{"status"}, {"dlq", "list"}, {"dlq", "replay"}, {"requeue-stale", "--stalled-after", "1s"}, {"alert", "check"},
	}
	for _, inj := range injections {
		for _, c := range commands {
			for _, flag := range []string{"--queue", "--effect-type"} {
				args := append(append([]string{}, c...), flag, inj)
				var v map[string]any
				// dlq replay exits 1 on a filter that matches no effect at
				// all (a misspelt queue); it still prints what it did.
				want := 0
				if c[0] == "dlq" && c[1] == "replay" {
					want = 1
				}
				r := b.runJSON(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1"}, want, &v, args...)
				for _, key := range []string{"queues", "items", "replayed", "requeued"} {
					if list, ok := v[key].([]any); ok && len(list) != 0 {
						t.Fatalf("%v matched something: %s", args, r.stdout)
					}
				}
			}
		}
		var rep ops.BrokerReport
		b.runJSON(t, nil, 0, &rep, "readiness", "broker", "--check", "--queue", inj)
		if rep.Samples != 0 {
			t.Fatalf("broker --queue %q read samples", inj)
		}
	}
	if r := b.run(t, nil, "dlq", "replay", "--id", "1 OR 1=1"); r.code != 1 {
		t.Fatalf("--id injection: exit %d", r.code)
	}
	if after := b.fingerprint(t); after != before {
		t.Fatalf("tables changed:\n%s\n%s", before, after)
	}
}

func TestCommandUnreachableDatabase(t *testing.T) {
	t.Parallel()
	b := &bundle{ctx: t.Context(), dsn: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"}
	for _, args := range [][]string{{"status"}, {"dlq", "list"}, {"alert", "check"}, {"readiness", "broker", "--check"}} {
		if r := b.run(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1"}, args...); r.code != 1 || r.stderr == "" {
			t.Fatalf("%v: exit %d, stderr %q; want 1 with a message", args, r.code, r.stderr)
		}
	}
}

// TestServeMetrics scrapes /metrics of `pgoutbox serve` with the Prometheus
// text parser.
func TestServeMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedSensitive(t, b)
	cmd := exec.CommandContext(b.ctx, binary(t), "--database-url", b.dsn, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	var base string
	for sc.Scan() {
		if i := strings.Index(sc.Text(), "http://"); i >= 0 {
			base = strings.Fields(sc.Text()[i:])[0]
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	if base == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("serve printed no address; stderr:\n%s", stderr.String())
	}
	families := scrape(t, base+"/metrics")
	http.DefaultClient.CloseIdleConnections()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve did not stop cleanly: %v\n%s", err, stderr.String())
	}
	for _, name := range []string{"pgoutbox_effects", "pgoutbox_effects_retrying", "pgoutbox_effects_parked", "pgoutbox_oldest_available_age_seconds",
		"pgoutbox_stalled_leases", "pgoutbox_oldest_xmin_age_seconds", "go_goroutines"} {
		if families[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	checkLabels(t, families)
	if v, ok := gauge(families, "pgoutbox_effects", map[string]string{"queue": "outbox_events", "effect_type": "record.upsert", "state": "dead_letter"}); !ok || v != 1 {
		t.Errorf("dead letters gauge: %v %v", v, ok)
	}
}

// TestCommandAlertCheckStalledLease is the case: a lease stalled 30
// minutes past OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES (40 minutes old
// against the default 10) fires stalled_leases, and with
// OUTBOX_ALERT_FAIL_ON_ALERT=1 the check exits 3. The stalled age comes
// from the same setting as status and requeue-stale; a non-positive
// --stalled-after is refused and nothing changes.
func TestCommandAlertCheckStalledLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seed(t, b.ctx, b.pool, eff{queue: "q", typ: "t", state: "leased", attempts: 1, leasedAgo: 40 * 60})
	before := b.fingerprint(t)

	r := b.run(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1"}, "alert", "check")
	if r.code != 3 || !regexp.MustCompile(`(?m)^stalled_leases +1 +>= 1 +ALERT$`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "1 rule(s) firing") {
		t.Fatalf("stalled lease: exit %d, want 3 and stalled_leases ALERT\n%s%s", r.code, r.stdout, r.stderr)
	}
	var out struct{ ops.AlertReport }
	b.runJSON(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1"}, 3, &out, "alert", "check")
	if f := out.FiringRules(); len(f) != 1 || f[0].Rule != ops.RuleStalledLeases || f[0].Value != 1 || f[0].Unit != "leases" {
		t.Fatalf("json firing rules: %+v", f)
	}
	// The same lease under a 60-minute stalled age is not stalled.
	r = b.run(t, []string{"OUTBOX_ALERT_FAIL_ON_ALERT=1", "OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES=60"}, "alert", "check")
	if r.code != 0 || !regexp.MustCompile(`(?m)^stalled_leases +0 +>= 1 +ok$`).MatchString(r.stdout) {
		t.Fatalf("60-minute stalled age: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, bad := range []string{"0", "-5m"} {
		r = b.run(t, nil, "alert", "check", "--stalled-after", bad)
		if r.code != 1 || !strings.Contains(r.stderr, "--stalled-after must be positive") {
			t.Fatalf("--stalled-after %s: exit %d\n%s%s", bad, r.code, r.stdout, r.stderr)
		}
	}
	if after := b.fingerprint(t); after != before {
		t.Fatal("alert check changed the database")
	}
}

// TestCommandDLQListShowsTheSubject: dlq list says what failed (issue 17,
// point 4): the projection's record id, the control plane's repository,
// release run and attempt, in text and --json, and nothing else of the
// payload (a credential-free but private value in another key, or under a
// subject key as a nested object, never appears).
func TestCommandDLQListShowsTheSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const private = "PRIVATE-payload-value"
	ids := seed(t, b.ctx, b.pool,
		eff{queue: "outbox_events", typ: "record.upsert", state: "dead_letter", attempts: 8, completedAgo: 5, lastError: "HTTP 400",
			payload: `{"record_id":"c17","version":3,"source_hash":"` + private + `"}`},
		eff{queue: "control_plane_outbox", typ: "github.workflow.dispatch", state: "dead_letter", attempts: 1, completedAgo: 4, lastError: "404",
			payload: `{"release_run_id":12,"execution_attempt_id":34,"attempt_number":2,"repository":"acme/api","installation_id":9,"workflow":"release.yml","ref":"` + private + `"}`},
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 1, completedAgo: 3, payload: `{"record_id":{"x":"` + private + `"},"release_run_id":"77","note":"` + private + `"}`},
		eff{queue: "q", typ: "t", state: "dead_letter", attempts: 1, completedAgo: 2, payload: `["` + private + `"]`},
	)
	before := b.fingerprint(t)
	var page ops.DeadLetterPage
	r := b.runJSON(t, nil, 0, &page, "dlq", "list")
	want := []ops.Subject{
		{RecordID: "c17"},
		{Repository: "acme/api", ReleaseRunID: 12, ExecutionAttemptID: 34, AttemptNumber: 2},
		{ReleaseRunID: 77},
		{},
	}
	if len(page.Items) != len(want) {
		t.Fatalf("items: %+v", page.Items)
	}
	for i, d := range page.Items {
		if d.ID != ids[i] || d.Subject != want[i] {
			t.Errorf("item %d: id %d subject %+v, want id %d subject %+v", i, d.ID, d.Subject, ids[i], want[i])
		}
	}
	if strings.Contains(r.stdout, private) || !strings.Contains(r.stdout, `"subject": {`) {
		t.Fatalf("--json shows payload content or no subject:\n%s", r.stdout)
	}
	r = b.run(t, nil, "dlq", "list")
	if r.code != 0 || strings.Contains(r.stdout, private) ||
		!regexp.MustCompile(`(?m)^\d+ +outbox_events +record.upsert +record c17 +8/8 `).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\d+ +control_plane_outbox +github.workflow.dispatch +acme/api release run 12 attempt 34 \(#2\) +1/8 `).MatchString(r.stdout) ||
		!regexp.MustCompile(`(?m)^\d+ +q +t +release run 77 +1/8 `).MatchString(r.stdout) {
		t.Fatalf("dlq list: %d\n%s", r.code, r.stdout)
	}
	columnsAligned(t, r.stdout)
	// Bad input: a clear error, nothing changed.
	if r := b.run(t, nil, "dlq", "list", "--after-id", "x"); r.code != 1 || !strings.Contains(r.stderr, "--after-id") {
		t.Fatalf("--after-id x: %d %s", r.code, r.stderr)
	}
	if after := b.fingerprint(t); after != before {
		t.Fatal("dlq list changed the database")
	}
}
