package sparqltest

import "syscall"

// sysProcAttr makes Linux stop Virtuoso when the test process dies first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
