// Package reliability is pgoutbox's reliability and security campaign
// (issue 9): every scenario is a test that runs against real PostgreSQL and
// real worker processes (the test binary re-executes itself as a worker that
// can be SIGKILLed, SIGSTOPped and resumed), or the real pgoutbox binary.
//
// Each worker process appends one line per target call (effect id, attempt,
// lease token, effect type, time) to an append-only call log. After a run,
// SQL plus the call logs give, per scenario:
//
//   - lost: effects not in a final or operator-visible state
//     (completed, dead_letter, reconciliation_required);
//   - duplicated: target calls beyond one per effect; never allowed for a
//     non-replay-safe type, counted (with the maximum per effect) for
//     replay-safe types;
//   - unexpected: calls for ids that were never enqueued.
//
// The scenarios and their figures are in docs/reliability.md. The suite is
// part of `make test`; `go test -short` skips the long scenarios. The sizes
// are scaled to fit about ten minutes on a 2-core machine;
// PGOUTBOX_RELIABILITY_FULL=1 runs the sizes the issue names (10,000 effects
// and 20 kills, a 5-minute open transaction, ...). With
// PGOUTBOX_RELIABILITY_REPORT=path every scenario appends its figures to
// that file as one JSON object per line.
//
// The campaign is a storage matrix, as the root package's tests are: with
// PGOUTBOX_TEST_STORAGE=batch (`make test-batch-reliability`) every queue
// that names no storage uses batch storage (docs/batch-storage.md), in the
// tests' clients, the worker processes and `pgoutbox serve`, and the ledger
// reads every effect's state through pgoutbox.effect_states. A scenario
// that checks the row storage itself pins it and says why.
//
// The scenarios run one after another (no t.Parallel): they measure times
// on a small machine, and the goroutine-baseline check of the partition
// scenario needs a quiet process.
package reliability
