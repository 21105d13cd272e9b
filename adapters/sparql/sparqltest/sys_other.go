//go:build !linux

package sparqltest

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
