package ops_test

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// served is a running `pgoutbox serve`.
type served struct {
	base, opBase string // main listener; operator listener ("" when none)
	stop         func() string
}

// startServe runs `pgoutbox serve --addr 127.0.0.1:0 args...` with env and
// reads the addresses it prints; stop ends it gracefully and returns
// everything it wrote.
func startServe(t *testing.T, b *bundle, env []string, args ...string) served {
	t.Helper()
	cmd := exec.CommandContext(b.ctx, binary(t), append([]string{"--database-url", b.dsn, "serve", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(cleanEnv(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out, stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var s served
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		i := strings.Index(line, "http://")
		switch {
		case i < 0:
		case strings.Contains(line, "operator routes"):
			s.opBase = strings.Fields(line[i:])[0]
		default:
			s.base = strings.Fields(line[i:])[0]
		}
		if s.base != "" && (s.opBase != "" || !strings.Contains(strings.Join(args, " "), "--operator-addr")) {
			break
		}
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		b := make([]byte, 4096)
		for {
			n, err := stdout.Read(b)
			mu.Lock()
			out.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	s.stop = func() string {
		http.DefaultClient.CloseIdleConnections()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-copied
		err := cmd.Wait()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("serve did not stop cleanly: %v", err)
		}
		return out.String() + stderr.String()
	}
	if s.base == "" {
		t.Fatalf("serve printed no address:\n%s", s.stop())
	}
	return s
}

func httpGet(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServeOperatorToken: with PGOUTBOX_OPERATOR_TOKEN, /metrics and
// /workers on the main listener answer 401 without the bearer (or with
// another) and 200 with it; the probes and the application routes are not
// affected, and the token appears in no output (issue 17, point 3).
func TestServeOperatorToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedSensitive(t, b)
	const token = "op-TOKEN-canary-31f7"
	s := startServe(t, b, []string{"PGOUTBOX_OPERATOR_TOKEN=" + token})
	for _, path := range []string{"/metrics", "/workers?format=json"} {
		for _, tok := range []string{"", "wrong-token"} {
			if code, body := httpGet(t, s.base+path, tok); code != http.StatusUnauthorized || strings.Contains(body, "pgoutbox_effects") ||
				strings.Contains(body, "outbox_events") {
				t.Errorf("%s with token %q: %d %s, want 401 and nothing of the page", path, tok, code, body)
			}
		}
		if code, body := httpGet(t, s.base+path, token); code != http.StatusOK || !strings.Contains(body, "outbox_events") {
			t.Errorf("%s with the token: %d %.200s", path, code, body)
		}
	}
	// The console signs in with the token: without it a page is the
	// sign-in form (after a redirect), never the data; the bearer reads.
	if code, body := httpGet(t, s.base+"/console/effects", ""); code != http.StatusOK || !strings.Contains(body, `id="signin"`) ||
		strings.Contains(body, "outbox_events") {
		t.Errorf("/console/effects without the token: %d %.300s, want the sign-in form and nothing of the list", code, body)
	}
	if code, body := httpGet(t, s.base+"/console/effects", token); code != http.StatusOK || !strings.Contains(body, "outbox_events") {
		t.Errorf("/console/effects with the token: %d %.300s", code, body)
	}
	if code, _ := httpGet(t, s.base+"/-/ready", ""); code != http.StatusOK {
		t.Errorf("/-/ready: %d", code)
	}
	if code, _ := httpGet(t, s.base+"/api/records/x", ""); code == http.StatusNotFound {
		t.Errorf("/api/records/x: 404, the application routes are missing")
	}
	if all := s.stop(); strings.Contains(all, token) {
		t.Fatalf("the operator token appears in serve's output:\n%s", all)
	}
}

// TestServeOperatorListener: with --operator-addr (PGOUTBOX_OPERATOR_ADDR)
// the webhook's listener no longer serves /metrics or /workers; the
// operator listener serves them (behind the token when it is set) and
// nothing else of the applications.
func TestServeOperatorListener(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seedSensitive(t, b)
	const token = "op-TOKEN-canary-88a2"
	for _, withToken := range []bool{false, true} {
		env := []string{"PGOUTBOX_OPERATOR_ADDR=127.0.0.1:0"}
		if withToken {
			env = append(env, "PGOUTBOX_OPERATOR_TOKEN="+token)
		}
		s := startServe(t, b, env, "--operator-addr", "127.0.0.1:0")
		if s.opBase == "" || s.opBase == s.base {
			t.Fatalf("no operator listener: %q %q\n%s", s.base, s.opBase, s.stop())
		}
		for _, path := range []string{"/metrics", "/workers", "/workers?format=json"} {
			if code, _ := httpGet(t, s.base+path, token); code != http.StatusNotFound {
				t.Errorf("token %v: main listener %s: %d, want 404", withToken, path, code)
			}
			code, body := httpGet(t, s.opBase+path, "")
			if withToken && code != http.StatusUnauthorized || !withToken && code != http.StatusOK {
				t.Errorf("token %v: operator listener %s without a token: %d", withToken, path, code)
			}
			if withToken {
				if code, body = httpGet(t, s.opBase+path, token); code != http.StatusOK {
					t.Errorf("operator listener %s with the token: %d", path, code)
				}
			}
			if code == http.StatusOK && !strings.Contains(body, "outbox_events") {
				t.Errorf("operator listener %s: %.200s", path, body)
			}
		}
		// The console is placed like the operator routes.
		if code, _ := httpGet(t, s.base+"/console/effects", token); code != http.StatusNotFound {
			t.Errorf("token %v: main listener /console/effects: %d, want 404", withToken, code)
		}
		if code, body := httpGet(t, s.opBase+"/console/effects", token); code != http.StatusOK || !strings.Contains(body, "outbox_events") ||
			strings.Contains(body, `id="readonly"`) == withToken {
			t.Errorf("token %v: operator listener /console/effects: %d %.300s", withToken, code, body)
		}
		if code, _ := httpGet(t, s.opBase+"/api/records/x", token); code != http.StatusNotFound {
			t.Errorf("operator listener serves application routes: %d", code)
		}
		if code, _ := httpGet(t, s.base+"/-/healthy", ""); code != http.StatusOK {
			t.Errorf("main /-/healthy: %d", code)
		}
		if all := s.stop(); strings.Contains(all, token) {
			t.Fatalf("the operator token appears in serve's output:\n%s", all)
		}
	}
	// Bad input: an operator address that cannot be listened on is a clear
	// error, exit 1, and nothing changed.
	before := b.fingerprint(t)
	r := b.run(t, nil, "serve", "--addr", "127.0.0.1:0", "--operator-addr", "256.0.0.1:1")
	if r.code != 1 || !strings.Contains(r.stderr, "--operator-addr 256.0.0.1:1") {
		t.Fatalf("bad --operator-addr: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if after := b.fingerprint(t); after != before {
		t.Fatal("a refused serve changed the database")
	}
}
