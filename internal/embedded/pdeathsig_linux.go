package embedded

import "syscall"

// setParentDeathSignal makes the kernel send the attached postmaster SIGQUIT
// (immediate shutdown) when the process that started it dies without
// stopping it: a panic, a test's -timeout, a kill -9.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGQUIT }
