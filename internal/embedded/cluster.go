package embedded

// The cluster plumbing shared by the persistent embedded cluster
// (EnsureLocal) and internal/pgtest's throwaway test clusters: finding the
// binaries, running them as the right OS user, initdb, starting (attached
// or detached), status, stop.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// superuser is the bootstrap superuser every cluster we create has.
const superuser = "postgres"

// StartTimeout bounds a server start or stop.
const StartTimeout = 60 * time.Second

// OSUser is the account the PostgreSQL binaries (and other servers that
// refuse root, such as PgBouncer) run as when we are root.
type OSUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
}

// binaries is one installation's bin directory.
type binaries struct {
	dir     string
	major   int
	version string // as printed by pg_ctl --version, e.g. "15.20"
}

func (b binaries) path(name string) string { return filepath.Join(b.dir, name) }

var versionRE = regexp.MustCompile(`\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?`)

// candidateBinDirs lists the directories that may hold initdb, pg_ctl and
// postgres, in preference order for equal versions: PATH first, then the
// usual package locations.
func candidateBinDirs() []string {
	var dirs []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if abs, err := filepath.Abs(p); err == nil {
			dirs = append(dirs, filepath.Dir(abs))
		}
	}
	for _, pattern := range []string{
		"/usr/lib/postgresql/*/bin",          // Debian, Ubuntu
		"/usr/pgsql-*/bin",                   // PGDG RPMs
		"/opt/homebrew/opt/postgresql@*/bin", // Homebrew, Apple silicon
		"/usr/local/opt/postgresql@*/bin",    // Homebrew, Intel
		"/usr/local/pgsql/bin",               // source installs
	} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	var out []string
	seen := map[string]bool{}
	for _, d := range dirs {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		}
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// findBinaries picks the installation to use: the one of major version want
// when want > 0 (an existing data directory needs the binaries that created
// it), else the highest version found.
func findBinaries(want int) (binaries, error) {
	var found []binaries
	for _, dir := range candidateBinDirs() {
		ok := true
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, exe(name))); err != nil {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		out, err := exec.Command(filepath.Join(dir, exe("pg_ctl")), "--version").Output()
		if err != nil {
			continue
		}
		m := versionRE.FindSubmatch(out)
		if m == nil {
			continue
		}
		major, _ := strconv.Atoi(string(m[1]))
		v := string(m[1])
		if len(m[2]) > 0 {
			v += "." + string(m[2])
		}
		found = append(found, binaries{dir: dir, major: major, version: v})
	}
	if len(found) == 0 {
		return binaries{}, ErrNoBinaries
	}
	if want > 0 {
		for _, b := range found {
			if b.major == want {
				return b, nil
			}
		}
		var have []string
		for _, b := range found {
			have = append(have, fmt.Sprintf("%d (%s)", b.major, b.dir))
		}
		return binaries{}, fmt.Errorf("%w: the data directory was created by PostgreSQL %d, whose binaries are not installed (found: %s)",
			errWrongVersion, want, strings.Join(have, ", "))
	}
	best := found[0]
	for _, b := range found[1:] {
		if b.major > best.major {
			best = b
		}
	}
	return best, nil
}

func exe(name string) string {
	if runtime.GOOS == "windows" {
		return name + ".exe"
	}
	return name
}

// ErrNoBinaries: no PostgreSQL server binaries are installed where Open
// looks. Callers add how to install them (InstallHint).
var ErrNoBinaries = errors.New("no PostgreSQL server binaries (initdb, pg_ctl, postgres) found on PATH or in " +
	"/usr/lib/postgresql/*/bin, /usr/pgsql-*/bin, /opt/homebrew/opt/postgresql@*/bin, /usr/local/opt/postgresql@*/bin")

// ErrUnreachable: the OS user that runs the server (postgres, when the
// process is root) cannot reach the cluster's directory.
var ErrUnreachable = errors.New("directory not reachable by the server's OS user")

// errWrongVersion: an existing data directory needs binaries of a major
// version that is not installed.
var errWrongVersion = errors.New("PostgreSQL version not installed")

// InstallHint says how to get binaries, or how to use a server instead
// (envVar names the variable that points at one).
func InstallHint(envVar, example string) string {
	return "install PostgreSQL's server binaries:\n" +
		"  Debian/Ubuntu: sudo apt-get install -y postgresql\n" +
		"  Fedora/RHEL:   sudo dnf install -y postgresql-server\n" +
		"  macOS:         brew install postgresql@15   (initdb and pg_ctl are found in $(brew --prefix)/opt/postgresql@*/bin)\n" +
		"or point at an existing server with a superuser connection string:\n" +
		"  " + envVar + "='postgres://postgres@127.0.0.1:5432/" + example + "?sslmode=disable'"
}

// Cluster is one data directory's layout and the binaries that serve it:
//
//	dir/pgdata         the data directory
//	dir/postgres.log   the server log
type Cluster struct {
	dir string
	bin binaries
	as  *OSUser // nil: run the binaries as ourselves
}

// DataDir is the data directory, Dir()/pgdata.
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "pgdata") }

// LogFile is the server log, Dir()/postgres.log.
func (c *Cluster) LogFile() string { return filepath.Join(c.dir, "postgres.log") }

// Open prepares dir (which must exist) for a cluster served by the
// binaries of major version want (0: the highest installed), and checks that
// the account that will run them can use dir.
func Open(ctx context.Context, dir string, want int) (*Cluster, error) {
	bin, err := findBinaries(want)
	if err != nil {
		return nil, err
	}
	as, err := ServerUser()
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, bin: bin, as: as}
	if as != nil {
		if err := Chown(dir, as); err != nil {
			return nil, fmt.Errorf("give %s to OS user %s: %w", dir, as.name, err)
		}
		// Run something harmless as that user inside dir: the child changes
		// directory after switching user, so this fails exactly when the user
		// cannot reach dir (a parent such as /root with mode 0700, ACLs, ...).
		cmd := c.command(ctx, false, "pg_ctl", "--version")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			if out = bytes.TrimSpace(out); len(out) > 0 {
				err = fmt.Errorf("%w: %s", err, out)
			}
			return nil, fmt.Errorf("%w: running as root, so PostgreSQL must run as OS user %s, which cannot access %s%s (%v)",
				ErrUnreachable, as.name, dir, blockingParent(dir), err)
		}
	}
	return c, nil
}

// blockingParent names, for an error message, the first directory on the way
// to dir that others cannot traverse.
func blockingParent(dir string) string {
	var chain []string
	for d := dir; ; d = filepath.Dir(d) {
		chain = append(chain, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	slices.Reverse(chain)
	for _, d := range chain[:len(chain)-1] { // dir itself is ours
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return fmt.Sprintf(" (%s has mode %04o)", d, fi.Mode().Perm())
		}
	}
	return ""
}

// command builds an invocation of one of the binaries, run as c.as, with
// PG* variables removed from its environment so that nothing but our
// arguments chooses the data directory, port or user.
func (c *Cluster) command(ctx context.Context, attached bool, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.bin.path(exe(name)), args...)
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	if c.as != nil {
		env = append(env, "HOME="+os.TempDir(), "USER="+c.as.name, "LOGNAME="+c.as.name)
	}
	cmd.Env = env
	cmd.SysProcAttr = SysProcAttr(c.as, attached)
	return cmd
}

// run runs a binary to completion; its output goes into the error.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	out, err := c.command(ctx, false, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// initializedMajor reports the major version of an existing data directory, 0 if
// there is none.
func initializedMajor(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "PG_VERSION"))
	if err != nil {
		return 0
	}
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

// InitDB creates the data directory: trust authentication, superuser
// "postgres", UTF8, C locale, listening on 127.0.0.1 only, no Unix socket
// (its default directory may not be writable by us). A throwaway cluster
// (durable false) also skips every fsync.
func (c *Cluster) InitDB(ctx context.Context, durable bool) error {
	args := []string{"-D", c.DataDir(), "-U", superuser, "-A", "trust", "-E", "UTF8", "--locale=C"}
	if !durable {
		args = append(args, "--no-sync")
	}
	if err := c.run(ctx, "initdb", args...); err != nil {
		return err
	}
	conf := "\n# pgoutbox (internal/embedded)\n" +
		"listen_addresses = '127.0.0.1'\n" +
		"unix_socket_directories = ''\n"
	if !durable {
		conf += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
	}
	f, err := os.OpenFile(filepath.Join(c.DataDir(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// running reports whether a postmaster serves the data directory.
func (c *Cluster) running(ctx context.Context) (bool, error) {
	err := c.command(ctx, false, "pg_ctl", "status", "-D", c.DataDir()).Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ee) && ee.ExitCode() == 3: // no server running
		return false, nil
	default:
		return false, fmt.Errorf("pg_ctl status -D %s: %w", c.DataDir(), err)
	}
}

// runningPort reads the port of the running postmaster from postmaster.pid.
func (c *Cluster) runningPort() (int, error) {
	b, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 4 {
		return 0, fmt.Errorf("postmaster.pid: too short")
	}
	return strconv.Atoi(strings.TrimSpace(lines[3]))
}

// startDetached starts the server with pg_ctl and waits until it accepts
// connections; it keeps running after we exit.
func (c *Cluster) startDetached(ctx context.Context, port int) error {
	return c.run(ctx, "pg_ctl", "start", "-w", "-s", "-t", strconv.Itoa(int(StartTimeout/time.Second)),
		"-D", c.DataDir(), "-l", c.LogFile(), "-o", "-p "+strconv.Itoa(port))
}

// stopDetached stops the server with pg_ctl stop -m fast (or -m immediate).
func (c *Cluster) stopDetached(ctx context.Context, mode string) error {
	return c.run(ctx, "pg_ctl", "stop", "-w", "-s", "-t", strconv.Itoa(int(StartTimeout/time.Second)),
		"-D", c.DataDir(), "-m", mode)
}

// Postmaster is a server started by StartAttached: our child, stopped by
// Stop or StopImmediate, and (on Linux) killed by the kernel if we die first.
type Postmaster struct {
	proc *os.Process
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done is closed
	log  *os.File
}

// StartAttached runs postgres directly as our child and waits until it
// accepts connections on 127.0.0.1:port.
func (c *Cluster) StartAttached(ctx context.Context, port int) (*Postmaster, error) {
	logf, err := os.OpenFile(c.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// Not ctx: the server outlives the call that starts it.
	cmd := c.command(context.Background(), true, "postgres", "-D", c.DataDir(), "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Fork from a fresh goroutine: the parent-death signal follows the forking
	// OS thread, and a fresh goroutine is never on a thread locked by (and so
	// dying with) some test's goroutine.
	started := make(chan error, 1)
	go func() { started <- cmd.Start() }()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	pm := &Postmaster{proc: cmd.Process, done: make(chan struct{}), log: logf}
	go func() {
		pm.err = cmd.Wait()
		close(pm.done)
	}()
	if err := waitReady(ctx, port, pm.done); err != nil {
		pm.Stop()
		return nil, fmt.Errorf("%w\n%s", err, Tail(c.LogFile(), 15))
	}
	return pm, nil
}

// Stop shuts the postmaster down (fast, then immediate if it lingers) and
// waits for it to exit.
func (pm *Postmaster) Stop() error {
	defer pm.log.Close()
	select {
	case <-pm.done:
		return nil
	default:
	}
	if err := interrupt(pm.proc); err != nil {
		_ = pm.proc.Kill()
	}
	t := time.NewTimer(StartTimeout)
	defer t.Stop()
	select {
	case <-pm.done:
		return nil
	case <-t.C:
		_ = kill(pm.proc)
		<-pm.done
		return fmt.Errorf("postgres did not stop within %s after SIGINT", StartTimeout)
	}
}

// waitReady polls until the server on port accepts a connection, it exits
// (exited is closed), or StartTimeout passes.
func waitReady(ctx context.Context, port int, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	dsn := DSN(port, "postgres")
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		ccancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-exited:
			return fmt.Errorf("postgres exited during startup")
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections on 127.0.0.1:%d: %w (last error: %v)", port, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// DSN is the connection string of database db on one of our clusters.
func DSN(port int, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", superuser, port, db)
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// PortFree reports whether nothing listens on 127.0.0.1:port.
func PortFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Tail returns the last n lines of a file, for error messages.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "server log (" + path + "):\n  " + strings.Join(lines, "\n  ")
}
