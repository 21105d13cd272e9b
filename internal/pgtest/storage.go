package pgtest

import (
	"os"
	"strconv"
)

// StorageEnv is the environment variable that runs a package's tests in
// one queue storage (pgoutbox.Storage: "rows" or "batch"): every queue
// that names no storage uses it, in the tests' clients and in the worker
// processes they start (which inherit the environment). Empty or unset:
// the engine's default. `make test-batch` sets it to "batch".
const StorageEnv = "PGOUTBOX_TEST_STORAGE"

// Storage is StorageEnv's value: the storage the test matrix asks for
// ("" when none).
func Storage() string { return os.Getenv(StorageEnv) }

// LanesEnv is the environment variable that gives every batch queue of a
// package's tests that names no lane count (pgoutbox.QueueConfig.Lanes)
// that many lanes, in the tests' clients and in the worker processes they
// start. Empty or unset: the engine's default. `make test-batch` sets it
// to 4.
const LanesEnv = "PGOUTBOX_TEST_LANES"

// Lanes is LanesEnv's value (0 when unset or not a number).
func Lanes() int {
	n, _ := strconv.Atoi(os.Getenv(LanesEnv))
	return n
}
