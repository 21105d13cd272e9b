// Package embedded runs PostgreSQL clusters from the installed server
// binaries (initdb, pg_ctl, postgres). It carries no test code: it is the
// product's default database, and internal/pgtest builds its test clusters
// on the same plumbing.
//
// # The embedded default cluster
//
// EnsureLocal keeps a persistent cluster in a directory (the binary's
// --data-dir, "./.pgoutbox" by default) and returns the connection string of
// its "pgoutbox" database: `pgoutbox serve` and `pgoutbox demo` use it when
// no DATABASE_URL is given. StopLocal stops it, ResetLocal deletes it, and
// LocalInitialized says whether a directory holds one. It listens on
// 127.0.0.1 only with trust authentication: for development and demos, not
// production.
//
// # The plumbing
//
// Open, Cluster and Postmaster find the binaries (the highest version on
// PATH or in the usual package locations, or the major version an existing
// data directory needs), run them as the "postgres" OS user when the process
// is root (PostgreSQL refuses root), initialize a data directory and start a
// server either detached (pg_ctl, outliving the process: EnsureLocal) or
// attached (a child of the process that, on Linux, dies with it:
// internal/pgtest's throwaway clusters).
package embedded
