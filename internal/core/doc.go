// Package core is the delivery engine shared by everything that delivers
// effects: the root package's Client, adapters/nats's consumer and relay, and
// the projection's projector. It holds, once each:
//
//   - Lifecycle: start, stop with a grace period, stop twice safely;
//   - Committer: the group committer of fenced completions;
//   - Leases and Extender: the registry of in-flight leases and the
//     batched lease extender that cancels deliveries whose lease was lost;
//   - Listener: the LISTEN/NOTIFY connection that wakes claim loops;
//   - Deliverer: one delivery (handler with a panic guard → classification
//     → complete, fail or release, fenced by the lease).
//
// Every statement it runs is internal/store's. It imports no package of the
// module but internal/store, so the root package can import it.
package core
