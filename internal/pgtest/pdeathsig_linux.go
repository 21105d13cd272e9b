package pgtest

import "syscall"

// setParentDeathSignal makes the kernel send the attached postmaster SIGQUIT
// (immediate shutdown) when the test process dies without running Main's
// cleanup: a panic, a -timeout, a kill -9.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGQUIT }
