//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package pgtest

import "syscall"

// terminateSignal asks a child for an immediate shutdown.
const terminateSignal = syscall.SIGTERM
