// Package ops is what an operator of pgoutbox sees and does (docs/operations.md):
// status, dead-letter listing and replay, stale-lease
// requeue, alert rules, the /metrics gauges, the aggregate samples workers
// persist and the broker-readiness decision made from them. The commands in
// internal/cli are thin layers over this package; every statement lives in
// internal/store (ops.go).
//
// # Guarantees
//
//   - Filters (queue, effect type, ids) reach PostgreSQL only as bind
//     parameters and are compared literally: a filter can narrow what a
//     command reads or changes, never what statement runs.
//   - Nothing here reads or prints a payload. Listings show ids, queues,
//     effect types, attempts, errors and times; metrics carry only the
//     labels queue, effect_type and state.
//   - Replay moves dead_letter rows only, with fresh attempts. A
//     reconciliation_required record is never touched by replay: only an
//     operator's resolve (the control plane's `reconcile`) closes it.
//   - Requeue of stalled leases uses the sweeper's routing
//     (pgoutbox.recovered_state, migration 00002): a non-replay-safe effect
//     whose delivery started goes to reconciliation_required, never back to
//     available. Clearing the lease token fences off the stalled worker.
//   - All ages use the database clock.
//   - The /metrics gauges come from one aggregate query ([Status]) per
//     refresh, cached ([StatsCache]); a scrape never issues one query per
//     series.
//
// # Definitions
//
// pending: effects in state available (including retrying ones); the
// projection's older names map as pending → available, retry → available
// with attempts > 0, processing → leased, processed → completed.
// retrying: available with attempts > 0. stalled lease: leased more than
// StalledAfterDefault (OUTBOX_STALLED_PROCESSING_MAX_AGE_MINUTES) ago,
// counted from leased_at, which lease extension does not move. oldest
// available age: now() minus the oldest available_at among available
// effects that are due. lag: completed_at - created_at, the time from the
// enqueuing transaction to the completion, over the last LagWindowDefault.
package ops
