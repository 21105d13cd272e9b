package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	fakegh "github.com/pgoutbox/pgoutbox/adapters/github/githubtest"
	fakesolr "github.com/pgoutbox/pgoutbox/adapters/solr/solrtest"
	"github.com/pgoutbox/pgoutbox/controlplane"
	"github.com/pgoutbox/pgoutbox/projection"
)

// buildBinary builds cmd/pgoutbox into dir.
func buildBinary(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "pgoutbox")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/pgoutbox")
	cmd.Dir = filepath.Join("..", "..") // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/pgoutbox: %v\n%s", err, out)
	}
	return bin
}

// baseEnv is the environment of the binary: only what the tests set, plus
// what a process needs to run.
func baseEnv(extra map[string]string) []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "LANG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// served is a running `pgoutbox serve`.
type served struct {
	cmd  *exec.Cmd
	url  string
	out  *syncBuffer // stdout and stderr
	done chan struct{}
	err  error
}

// serve runs `pgoutbox serve --addr addr` with env and waits until
// /-/ready answers 200.
func serve(t *testing.T, ctx context.Context, bin, addr string, env []string) *served {
	t.Helper()
	s := &served{url: "http://" + addr, out: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, "serve", "--addr", addr)
	s.cmd.Env = env
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	waitFor(t, ctx, "pgoutbox serve ready", 50*time.Millisecond, func() bool {
		select {
		case <-s.done:
			t.Fatalf("pgoutbox serve exited: %v\n%s", s.err, s.out.String())
		default:
		}
		resp, err := http.Get(s.url + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// stop sends SIGTERM (graceful shutdown) and waits for exit 0.
func (s *served) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-ctx.Done():
		t.Fatal("pgoutbox serve did not stop after SIGTERM")
	}
	if s.err != nil {
		t.Errorf("pgoutbox serve: %v\n%s", s.err, tail2(s.out.String(), 20))
	}
}

// cli runs one pgoutbox command and returns its output and exit code.
func cli(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("pgoutbox %s: %v", strings.Join(args, " "), err)
	}
	return o.String(), e.String(), code
}

// stack is everything a binary test runs against: a database, the GitHub
// emulator (behind a recorder that keeps the installation tokens and app
// JWTs it hands out, to search for them), the Solr emulator with basic
// auth, and `pgoutbox serve` configured with a unique canary for every
// secret.
type stack struct {
	ctx      context.Context
	bin      string
	dsn      string // without the canary password
	db       *db
	env      []string
	canaries map[string]string // name → canary value
	emu      *fakegh.Server
	solr     *fakesolr.Server
	srv      *served
	admin    *pgx.Conn

	mu      sync.Mutex
	issued  []string // installation tokens and JWTs seen on the wire
	bodies  []string // every HTTP answer a test read
	alertRx []string // what the alert webhook received
}

const (
	installationID = 7001
	repoID         = 8001
	repoName       = "acme/api"
)

func newStack(t *testing.T, ctx context.Context, bin string) *stack {
	t.Helper()
	s := &stack{ctx: ctx, bin: bin, canaries: map[string]string{}}
	d := newDB(t)
	s.db, s.dsn = d, d.dsn
	// The binary has no storage setting: its queues take the storage
	// recorded in the database, the test matrix's.
	d.useTestStorage(t, ctx, controlplane.QueueJobs, controlplane.QueueOutbox, projection.Queue)
	nonce := strconv.FormatInt(time.Now().UnixNano(), 36)
	for _, name := range []string{"GITHUB_WEBHOOK_SECRET", "PGOUTBOX_API_TOKEN", "CRON_SECRET", "DB_PASSWORD", "SOLR_PASSWORD", "ALERT_URL_TOKEN"} {
		s.canaries[name] = "canary-" + strings.ToLower(strings.ReplaceAll(name, "_", "-")) + "-" + nonce
	}
	addr := freeAddr(t)
	s.emu = fakegh.New(fakegh.Options{WebhookURL: "http://" + addr + "/webhooks/github", WebhookSecret: []byte(s.canaries["GITHUB_WEBHOOK_SECRET"])})
	t.Cleanup(s.emu.Close)
	// The recorder in front of the emulator.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if auth := r.Header.Get("Authorization"); auth != "" {
			if _, tok, ok := strings.Cut(auth, " "); ok {
				s.mu.Lock()
				s.issued = append(s.issued, tok)
				s.mu.Unlock()
			}
		}
		rec := httptest.NewRecorder()
		s.emu.Handler().ServeHTTP(rec, r)
		if strings.HasSuffix(r.URL.Path, "/access_tokens") {
			var tok struct {
				Token string `json:"token"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &tok) == nil && tok.Token != "" {
				s.mu.Lock()
				s.issued = append(s.issued, tok.Token)
				s.mu.Unlock()
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(api.Close)
	s.solr = fakesolr.New(fakesolr.Options{Username: "solr-user", Password: s.canaries["SOLR_PASSWORD"]})
	t.Cleanup(s.solr.Close)
	alert := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.alertRx = append(s.alertRx, string(b)) // the body only: the receiver knows its own URL
		s.mu.Unlock()
		http.Error(w, "alert receiver down", http.StatusBadGateway) // the error path of `alert check`
	}))
	t.Cleanup(alert.Close)

	dbURL := strings.Replace(s.dsn, "postgres://postgres@", "postgres://postgres:"+s.canaries["DB_PASSWORD"]+"@", 1)
	if dbURL == s.dsn {
		t.Fatalf("cannot put a password into %s", s.dsn)
	}
	s.env = baseEnv(map[string]string{
		"DATABASE_URL":                   dbURL,
		"PGOUTBOX_LOG_LEVEL":             "debug",
		"GITHUB_WEBHOOK_SECRET":          s.canaries["GITHUB_WEBHOOK_SECRET"],
		"GITHUB_APP_ID":                  s.emu.AppID(),
		"GITHUB_APP_PRIVATE_KEY":         string(s.emu.AppPrivateKeyPEM()),
		"GITHUB_API_URL":                 api.URL,
		"PGOUTBOX_API_TOKEN":             s.canaries["PGOUTBOX_API_TOKEN"],
		"CRON_SECRET":                    s.canaries["CRON_SECRET"],
		"METAMUSEUM_OUTBOX_CRON_ENABLED": "1",
		"OUTBOX_PROJECT_TO_SOLR":         "1",
		"SOLR_BASE_URL":                  s.solr.URL(),
		"SOLR_CORE":                      fakesolr.CoreDefault,
		"SOLR_USERNAME":                  "solr-user",
		"SOLR_PASSWORD":                  s.canaries["SOLR_PASSWORD"],
		"WEBHOOK_MAX_BODY_BYTES":         strconv.Itoa(64 << 10),
		"PROJECTION_MAX_RECORD_BYTES":    strconv.Itoa(8 << 10),
		"OUTBOX_ALERT_WEBHOOK_URL":       alert.URL + "/hooks/" + s.canaries["ALERT_URL_TOKEN"] + "?token=" + s.canaries["ALERT_URL_TOKEN"],
		"OUTBOX_POLL_INTERVAL":           "200ms",
		"OUTBOX_SWEEP_INTERVAL":          "1s",
	})
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	s.admin = conn
	s.srv = serve(t, ctx, bin, addr, s.env)
	return s
}

func (s *stack) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := s.admin.QueryRow(s.ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// counts is what a refused request must not change.
func (s *stack) counts(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("inbox=%d effects=%d records=%d runs=%d",
		s.scalar(t, `SELECT count(*) FROM control_plane.webhook_inbox`),
		s.scalar(t, `SELECT count(*) FROM pgoutbox.effect_states`), // either storage
		s.scalar(t, `SELECT count(*) FROM storage_documents.records`),
		s.scalar(t, `SELECT count(*) FROM control_plane.release_runs`))
}

// do sends a request and returns its status, keeping the answer's body for
// the canary search.
func (s *stack) do(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req.WithContext(s.ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	s.mu.Lock()
	s.bodies = append(s.bodies, string(b))
	s.mu.Unlock()
	return resp.StatusCode, resp.Header, string(b)
}
