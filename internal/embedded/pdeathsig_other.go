//go:build (darwin || freebsd || netbsd || openbsd || dragonfly) && !linux

package embedded

import "syscall"

// setParentDeathSignal is a no-op here: there is no parent-death signal, so a
// process killed before it stops its attached postmaster (a test process
// killed before pgtest.Main's cleanup) leaves it running until it is
// stopped by hand.
func setParentDeathSignal(*syscall.SysProcAttr) {}
