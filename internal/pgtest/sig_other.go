//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package pgtest

import "os"

// terminateSignal asks a child for an immediate shutdown.
var terminateSignal = os.Kill
