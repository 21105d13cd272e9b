package pgtest

import "os"

// StorageEnv is the environment variable that runs a package's tests in
// one queue storage (pgoutbox.Storage: "rows" or "batch"): every queue
// that names no storage uses it, in the tests' clients and in the worker
// processes they start (which inherit the environment). Empty or unset:
// the engine's default. `make test-batch` sets it to "batch".
const StorageEnv = "PGOUTBOX_TEST_STORAGE"

// Storage is StorageEnv's value: the storage the test matrix asks for
// ("" when none).
func Storage() string { return os.Getenv(StorageEnv) }
