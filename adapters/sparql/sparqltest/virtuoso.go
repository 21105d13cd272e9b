// Package sparqltest runs a real SPARQL 1.1 store for tests: OpenLink
// Virtuoso (Debian package virtuoso-opensource), started on loopback on free
// ports in a temporary directory, with SPARQL Update granted to the
// anonymous /sparql user.
//
// Usage: call Main from TestMain (it stops the server after the tests), and
// Start(t) in each test that needs the store; every test of the process
// shares one server, so tests use distinct graph IRIs.
//
// When the Virtuoso binaries are missing, Start fails the test with the
// command that installs them:
//
//	apt-get update && apt-get install -y virtuoso-opensource
package sparqltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// InstallHint is the command that installs Virtuoso on Debian and Ubuntu.
const InstallHint = "apt-get update && apt-get install -y virtuoso-opensource"

// StartTimeout bounds how long Virtuoso may take to accept connections.
const StartTimeout = 90 * time.Second

// Server is a running Virtuoso.
type Server struct {
	// SPARQLURL is the SPARQL 1.1 query and update endpoint (/sparql).
	SPARQLURL string
	// GraphStoreURL is the SPARQL 1.1 Graph Store HTTP Protocol endpoint
	// (/sparql-graph-crud), writable by the anonymous user.
	GraphStoreURL string
	// ISQLPort is the SQL port (isql-vt PORT dba dba).
	ISQLPort int

	dir  string
	cmd  *exec.Cmd
	done chan struct{}
	isql string
}

var (
	mu      sync.Mutex
	shared  *Server
	failure error
)

// Binaries returns the paths of virtuoso-t and isql-vt, or an error that
// names the install command.
func Binaries() (server, isql string, err error) {
	find := func(names ...string) string {
		for _, n := range names {
			if p, err := exec.LookPath(n); err == nil {
				return p
			}
			for _, dir := range []string{"/usr/bin", "/usr/local/bin", "/usr/local/virtuoso-opensource/bin", "/opt/virtuoso-opensource/bin"} {
				p := filepath.Join(dir, n)
				if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
					return p
				}
			}
		}
		return ""
	}
	server, isql = find("virtuoso-t"), find("isql-vt", "isql")
	if server == "" || isql == "" {
		return "", "", fmt.Errorf("the Virtuoso binaries (virtuoso-t, isql-vt) are not installed; install them with: %s", InstallHint)
	}
	return server, isql, nil
}

// Start returns the process's Virtuoso, starting it on first use. It fails
// tb when Virtuoso is not installed or does not start.
func Start(tb testing.TB) *Server {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if shared == nil && failure == nil {
		shared, failure = start()
	}
	if failure != nil {
		tb.Fatalf("sparqltest: %v", failure)
	}
	return shared
}

// Stop stops the process's Virtuoso (if started) and deletes its directory.
// Use it as the first check of pgtest.Main; a server left running by a
// crashed test process dies with it (parent-death signal) and its directory
// is deleted by the next Start.
func Stop() error {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		return nil
	}
	err := shared.stop()
	shared = nil
	return err
}

// Main runs the tests and stops the server afterwards; extra checks (goleak)
// run after it is gone.
func Main(m *testing.M, after ...func() error) {
	code := m.Run()
	if err := Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "sparqltest: stop:", err)
	}
	if code == 0 {
		for _, f := range after {
			if err := f(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}
	}
	os.Exit(code)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

const iniTemplate = `[Database]
DatabaseFile       = {dir}/virtuoso.db
ErrorLogFile       = {dir}/virtuoso.log
LockFile           = {dir}/virtuoso.lck
TransactionFile    = {dir}/virtuoso.trx
xa_persistent_file = {dir}/virtuoso.pxa
ErrorLogLevel      = 7
FileExtend         = 200
Striping           = 0
TempStorage        = TempDatabase

[TempDatabase]
DatabaseFile       = {dir}/virtuoso-temp.db
TransactionFile    = {dir}/virtuoso-temp.trx
Striping           = 0

[Parameters]
ServerPort               = 127.0.0.1:{isql}
DisableUnixSocket        = 1
MaxClientConnections     = 20
CheckpointInterval       = 0
O_DIRECT                 = 0
CaseMode                 = 2
DirsAllowed              = {dir}
NumberOfBuffers          = 20000
MaxDirtyBuffers          = 15000
ThreadsPerQuery          = 2
AsyncQueueMaxThreads     = 4
MaxQueryMem              = 256M

[HTTPServer]
ServerPort                  = 127.0.0.1:{http}
ServerRoot                  = {dir}
MaxClientConnections        = 20
ServerThreads               = 20
EnabledDavVSP               = 0
HTTPProxyEnabled            = 0
MaxKeepAlives               = 20
KeepAliveTimeout            = 10
Charset                     = UTF-8

[SPARQL]
ResultSetMaxRows           = 100000
MaxQueryExecutionTime      = 60
DefaultGraph               = urn:pgoutbox:default
`

func start() (_ *Server, err error) {
	server, isql, err := Binaries()
	if err != nil {
		return nil, err
	}
	sweep()
	dir, err := os.MkdirTemp("", "pgoutbox-virtuoso-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	isqlPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	ini := strings.NewReplacer("{dir}", dir, "{isql}", strconv.Itoa(isqlPort), "{http}", strconv.Itoa(httpPort)).Replace(iniTemplate)
	if err := os.WriteFile(filepath.Join(dir, "virtuoso.ini"), []byte(ini), 0o600); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := exec.Command(server, "+foreground", "+configfile", filepath.Join(dir, "virtuoso.ini"))
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start virtuoso-t: %w", err)
	}
	s := &Server{
		SPARQLURL:     fmt.Sprintf("http://127.0.0.1:%d/sparql", httpPort),
		GraphStoreURL: fmt.Sprintf("http://127.0.0.1:%d/sparql-graph-crud", httpPort),
		ISQLPort:      isqlPort, dir: dir, cmd: cmd, done: make(chan struct{}), isql: isql,
	}
	go func() { _ = cmd.Wait(); close(s.done) }()
	defer func() {
		if err != nil {
			_ = s.stop()
			err = fmt.Errorf("%w\n--- virtuoso output ---\n%s\n--- virtuoso.log ---\n%s", err, out.String(), tailFile(filepath.Join(dir, "virtuoso.log")))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	// Wait until the SQL port answers (Virtuoso's readiness), polling: the
	// server gives no other signal.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := s.ISQL(ctx, "status('');"); err == nil {
			break
		}
		select {
		case <-s.done:
			return nil, errors.New("virtuoso-t exited during start-up")
		case <-ctx.Done():
			return nil, errors.New("virtuoso-t did not accept connections in time")
		case <-tick.C:
		}
	}
	if out, err := s.ISQL(ctx, `GRANT SPARQL_UPDATE TO "SPARQL";`); err != nil {
		return nil, fmt.Errorf("grant SPARQL_UPDATE: %v: %s", err, out)
	}
	return s, nil
}

// ISQL runs statements as dba through isql-vt.
func (s *Server) ISQL(ctx context.Context, sql string) (string, error) {
	cmd := exec.CommandContext(ctx, s.isql, strconv.Itoa(s.ISQLPort), "dba", "dba", "exec="+sql)
	out, err := cmd.CombinedOutput()
	if err == nil && strings.Contains(string(out), "*** Error") {
		err = errors.New("isql reported an error")
	}
	return string(out), err
}

func (s *Server) stop() error {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(20 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	return os.RemoveAll(s.dir)
}

// sweep deletes the directories of servers whose test process is gone.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgoutbox-virtuoso-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if p, err := os.FindProcess(pid); err == nil && p.Signal(syscall.Signal(0)) == nil {
			continue // still running
		}
		_ = os.RemoveAll(d)
	}
}

func tailFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Term is one RDF term of a SPARQL JSON result binding.
type Term struct {
	// Type is "uri", "literal", "typed-literal" (Virtuoso's name for a typed
	// literal) or "bnode".
	Type string `json:"type"`
	// Value is the IRI or the literal's lexical form as the store returns it.
	Value string `json:"value"`
	// Datatype is a typed literal's datatype IRI ("" otherwise).
	Datatype string `json:"datatype"`
	// Lang is a literal's language tag ("" otherwise).
	Lang string `json:"xml:lang"`
}

// SelectTerms runs a SPARQL SELECT on /sparql and returns its bindings
// (variable → term of each row).
func (s *Server) SelectTerms(ctx context.Context, query string) ([]map[string]Term, error) {
	form := url.Values{"query": {query}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.SPARQLURL, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/sparql-results+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("SPARQL query: HTTP %d: %s", resp.StatusCode, b)
	}
	var res struct {
		Results struct {
			Bindings []map[string]Term `json:"bindings"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("SPARQL query: %w: %s", err, b)
	}
	return res.Results.Bindings, nil
}

// Select runs a SPARQL SELECT on /sparql and returns its bindings (variable
// → value of each row).
func (s *Server) Select(ctx context.Context, query string) ([]map[string]string, error) {
	rows, err := s.SelectTerms(ctx, query)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]string, 0, len(rows))
	for _, row := range rows {
		m := map[string]string{}
		for k, v := range row {
			m[k] = v.Value
		}
		out = append(out, m)
	}
	return out, nil
}

// Count runs a SELECT (COUNT(…) AS ?n) query and returns ?n.
func (s *Server) Count(ctx context.Context, query string) (int, error) {
	rows, err := s.Select(ctx, query)
	if err != nil {
		return 0, err
	}
	if len(rows) != 1 {
		return 0, fmt.Errorf("count query returned %d rows", len(rows))
	}
	return strconv.Atoi(rows[0]["n"])
}
