// Package engine is the delivery engine of the root package, which aliases
// its types as River's root aliases rivertype's: what a delivery is
// (Delivery, EffectType, Handler, TxHandler), how it ends (Outcome, State,
// OutcomeError and its constructors, classified once by RouteOf, with
// Backoff), and the machinery that runs the root's Client and the public
// API through which everything else that delivers effects (adapters/nats's
// consumer and relay, the projection's projector) reaches the same engine
// (Lease.Deliver, Completer, LeaseKeeper, EnqueueListener); nothing outside
// the root imports it (TestApplicationsUseThePublicAPI). It holds, once
// each:
//
//   - Lifecycle: start, stop with a grace period, stop twice safely (an
//     alias of internal/lifecycle's, shared with the adapters);
//   - Committer: the group committer of fenced completions;
//   - Leases and Extender: the registry of in-flight leases and the
//     batched lease extender that cancels deliveries whose lease was lost;
//   - Listener: the LISTEN/NOTIFY connection that wakes claim loops;
//   - Deliverer: one delivery (handler with a panic guard → classification
//     → complete, fail or release, fenced by the lease).
//
// Every statement it runs is internal/store's. It imports no package of the
// module but internal/store and internal/lifecycle, so the root package can
// import it.
package engine
