//go:build (darwin || freebsd || netbsd || openbsd || dragonfly) && !linux

package pgtest

import "syscall"

// setParentDeathSignal is a no-op here: there is no parent-death signal, so a
// test process killed before Main's cleanup leaves its throwaway postmaster
// running until it is stopped by hand.
func setParentDeathSignal(*syscall.SysProcAttr) {}
