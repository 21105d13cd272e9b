//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgtest

import (
	"os"
	"syscall"
)

// On these platforms there is no root delegation, no file locking and no
// stale-cluster sweeping; the clusters otherwise work where the PostgreSQL
// binaries do.

func serverUser() (*osUser, error)                   { return nil, nil }
func sysProcAttr(*osUser, bool) *syscall.SysProcAttr { return nil }
func chown(string, *osUser) error                    { return nil }
func processAlive(int) bool                          { return true }
func lockFile(string) (func(), error)                { return func() {}, nil }
func interrupt(p *os.Process) error                  { return p.Kill() }
func kill(p *os.Process) error                       { return p.Kill() }

// terminateSignal asks a child for an immediate shutdown.
var terminateSignal = os.Kill
