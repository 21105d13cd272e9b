//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package embedded

import (
	"os"
	"syscall"
)

// On these platforms there is no root delegation, no file locking and no
// stale-cluster sweeping; the clusters otherwise work where the PostgreSQL
// binaries do.

func ServerUser() (*OSUser, error)                   { return nil, nil }
func SysProcAttr(*OSUser, bool) *syscall.SysProcAttr { return nil }
func Chown(string, *OSUser) error                    { return nil }
func ProcessAlive(int) bool                          { return true }
func lockFile(string) (func(), error)                { return func() {}, nil }
func interrupt(p *os.Process) error                  { return p.Kill() }
func kill(p *os.Process) error                       { return p.Kill() }
