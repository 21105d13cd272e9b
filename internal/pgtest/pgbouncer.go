package pgtest

// A real PgBouncer in transaction pooling mode in front of a test server:
// the pooler tests (docs/poolers.md) run the engine through it.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/embedded"
)

// PgBouncer is a PgBouncer process of one test, in transaction pooling mode,
// forwarding every database name to one PostgreSQL server. It is a child of
// the test process (run as the OS user "postgres" when the tests run as
// root: PgBouncer refuses to run as root), listens on a free port of
// 127.0.0.1, authenticates clients with auth_type trust against a generated
// userlist, and is stopped when the test's cleanups run.
type PgBouncer struct {
	port     int
	dir      string
	user     string
	password string
}

// PgBouncerPoolSizeDefault is the server connections PgBouncer opens per
// database and user (default_pool_size) unless NewPgBouncer's settings say
// otherwise.
const PgBouncerPoolSizeDefault = 20

// pgbouncerBinary finds the pgbouncer executable: on PATH, or where Debian
// installs it (/usr/sbin is not on every PATH).
func pgbouncerBinary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer", "/opt/homebrew/bin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("pgtest: no pgbouncer executable on PATH or in /usr/sbin: install it " +
		"(Debian/Ubuntu: sudo apt-get install -y pgbouncer, or ./scripts/test-deps; macOS: brew install pgbouncer)")
}

// NewPgBouncer starts a PgBouncer in transaction pooling mode in front of
// the server of backendDSN (a URL from NewDB, AdminDSN or Cluster.DSN; its
// database is ignored: every database name is forwarded). settings are
// extra lines for the [pgbouncer] section (e.g. "default_pool_size = 2").
// It fails tb when pgbouncer is not installed.
func NewPgBouncer(tb testing.TB, backendDSN string, settings ...string) *PgBouncer {
	tb.Helper()
	bin, err := pgbouncerBinary()
	if err != nil {
		tb.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(backendDSN)
	if err != nil {
		tb.Fatalf("pgtest: pgbouncer backend: %v", err)
	}
	as, err := embedded.ServerUser()
	if err != nil {
		tb.Fatalf("pgtest: pgbouncer: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgoutbox-pgbouncer-")
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := embedded.Chown(dir, as); err != nil {
		tb.Fatalf("pgtest: pgbouncer directory: %v", err)
	}
	pb := &PgBouncer{dir: dir, user: cfg.User, password: cfg.Password}
	for attempt := 1; ; attempt++ {
		port, err := embedded.FreePort()
		if err != nil {
			tb.Fatalf("pgtest: %v", err)
		}
		pb.port = port
		stop, err := pb.start(bin, as, cfg, settings)
		if err == nil {
			tb.Cleanup(stop)
			return pb
		}
		if attempt == 3 {
			tb.Fatalf("pgtest: start pgbouncer: %v", err)
		}
	}
}

// conf writes pgbouncer.ini and the userlist.
func (pb *PgBouncer) conf(cfg *pgx.ConnConfig, settings []string) (string, error) {
	backend := fmt.Sprintf("host=%s port=%d user=%s", cfg.Host, cfg.Port, cfg.User)
	if cfg.Password != "" {
		backend += " password=" + cfg.Password
	}
	ini := "[databases]\n" +
		"* = " + backend + "\n\n" +
		"[pgbouncer]\n" +
		"listen_addr = 127.0.0.1\n" +
		"listen_port = " + strconv.Itoa(pb.port) + "\n" +
		"unix_socket_dir =\n" +
		"auth_type = trust\n" +
		"auth_file = " + filepath.Join(pb.dir, "userlist.txt") + "\n" +
		"admin_users = " + cfg.User + "\n" +
		"pool_mode = transaction\n" +
		"max_client_conn = 1000\n" +
		"default_pool_size = " + strconv.Itoa(PgBouncerPoolSizeDefault) + "\n" +
		"server_reset_query =\n" +
		"logfile = " + pb.LogFile() + "\n" +
		"log_connections = 0\n" +
		"log_disconnections = 0\n"
	for _, s := range settings {
		ini += s + "\n"
	}
	path := filepath.Join(pb.dir, "pgbouncer.ini")
	if err := os.WriteFile(path, []byte(ini), 0o644); err != nil {
		return "", err
	}
	// auth_type trust still requires the user to be listed.
	users := fmt.Sprintf("%q %q\n", cfg.User, "")
	if err := os.WriteFile(filepath.Join(pb.dir, "userlist.txt"), []byte(users), 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// start runs pgbouncer as our child and waits until it forwards a
// connection; stop shuts it down.
func (pb *PgBouncer) start(bin string, as *embedded.OSUser, cfg *pgx.ConnConfig, settings []string) (stop func(), err error) {
	ini, err := pb.conf(cfg, settings)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{ini, filepath.Join(pb.dir, "userlist.txt")} {
		if err := embedded.Chown(f, as); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command(bin, ini)
	cmd.Dir = pb.dir
	cmd.SysProcAttr = embedded.SysProcAttr(as, true)
	out, err := os.OpenFile(filepath.Join(pb.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }() // see startAttached: a fresh thread for the death signal
	if err := <-started; err != nil {
		out.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); out.Close(); close(done) }()
	stop = func() {
		_ = interruptHard(cmd.Process)
		select {
		case <-done:
		case <-time.After(embedded.StartTimeout):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), embedded.StartTimeout)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, cerr := pgx.Connect(cctx, pb.DSN("postgres"))
		ccancel()
		if cerr == nil {
			_ = conn.Close(ctx)
			return stop, nil
		}
		select {
		case <-done:
			return nil, fmt.Errorf("pgbouncer exited during startup: %s\n%s", embedded.Tail(filepath.Join(pb.dir, "stderr.log"), 10), embedded.Tail(pb.LogFile(), 10))
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("pgbouncer did not forward a connection on 127.0.0.1:%d: %v\n%s", pb.port, cerr, embedded.Tail(pb.LogFile(), 10))
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// interruptHard asks PgBouncer for an immediate shutdown (SIGTERM; SIGINT
// would wait for every client to leave).
func interruptHard(p *os.Process) error { return p.Signal(terminateSignal) }

// Port is the port PgBouncer listens on (127.0.0.1).
func (pb *PgBouncer) Port() int { return pb.port }

// LogFile is PgBouncer's log, for failure messages.
func (pb *PgBouncer) LogFile() string { return filepath.Join(pb.dir, "pgbouncer.log") }

// DSN is the connection string of database db through PgBouncer, in pgx's
// exec query mode (default_query_exec_mode=exec: no named prepared
// statements, which PgBouncer before 1.21 cannot route; docs/poolers.md).
func (pb *PgBouncer) DSN(db string) string {
	u := url.URL{Scheme: "postgres", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(pb.port)), Path: "/" + db,
		RawQuery: "sslmode=disable&default_query_exec_mode=exec"}
	if pb.password != "" {
		u.User = url.UserPassword(pb.user, pb.password)
	} else {
		u.User = url.User(pb.user)
	}
	return u.String()
}

// Pooled returns the connection string through PgBouncer of the database
// that directDSN names (NewDB's or Cluster.NewDB's result).
func (pb *PgBouncer) Pooled(tb testing.TB, directDSN string) string {
	tb.Helper()
	cfg, err := pgx.ParseConfig(directDSN)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return pb.DSN(cfg.Database)
}

// NewPooledDB is NewDB behind a PgBouncer of its own in transaction mode: it
// returns the database's connection string through PgBouncer (exec query
// mode) and its direct one (a session: for LISTEN, migrations, and the
// test's own checks).
func NewPooledDB(tb testing.TB) (pooled, direct string) {
	tb.Helper()
	direct = NewDB(tb)
	pb := NewPgBouncer(tb, direct)
	return pb.Pooled(tb, direct), direct
}
