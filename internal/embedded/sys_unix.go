//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package embedded

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// ServerUser returns the OS account the PostgreSQL binaries must run as, or
// nil to run them as the current user. initdb, pg_ctl and postgres refuse to
// run as root, so a root process delegates to the "postgres" account.
func ServerUser() (*OSUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and PostgreSQL refuses to run as root; "+
			"there is no \"postgres\" OS user to run it as (%v): create one "+
			"(e.g. `useradd --system --home-dir /var/lib/postgresql postgres`) or run as an unprivileged user", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("OS user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("OS user postgres: gid %q: %w", u.Gid, err)
	}
	ou := &OSUser{name: u.Username, uid: uint32(uid), gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, id := range ids {
			if g, err := strconv.ParseUint(id, 10, 32); err == nil {
				ou.groups = append(ou.groups, uint32(g))
			}
		}
	}
	return ou, nil
}

// SysProcAttr returns the process attributes that run a child as u (nil: as
// ourselves), in its own process group; attached children also get a
// parent-death signal where the platform has one.
func SysProcAttr(u *OSUser, attached bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if u != nil {
		a.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	if attached {
		setParentDeathSignal(a)
	}
	return a
}

// Chown gives path to u (no-op when u is nil).
func Chown(path string, u *OSUser) error {
	if u == nil {
		return nil
	}
	return os.Lchown(path, int(u.uid), int(u.gid))
}

// ProcessAlive reports whether pid names a live process. A process we may not
// signal (EPERM) is alive.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// lockFile takes an exclusive advisory lock on path (created if needed) and
// returns the function that releases it.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// interrupt asks an attached postmaster for a fast shutdown; kill forces an
// immediate one.
func interrupt(p *os.Process) error { return p.Signal(syscall.SIGINT) }
func kill(p *os.Process) error      { return p.Signal(syscall.SIGQUIT) }
