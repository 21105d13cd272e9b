// Package pgtest provides real PostgreSQL servers for tests: a fresh
// database for every test, restartable clusters and PgBouncer. It is test
// code (it imports testing) and only tests import it; the persistent
// "embedded default" cluster the pgoutbox binary uses when no DATABASE_URL
// is given lives in internal/embedded, whose cluster plumbing this package
// shares.
//
// # Tests
//
// Every test package that touches PostgreSQL uses Main as its TestMain and
// NewDB (or NewPool) in its tests:
//
//	func TestMain(m *testing.M) {
//		pgtest.Main(m, func() error { return goleak.Find() })
//	}
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		pool, _ := pgtest.NewPool(t)
//		...
//	}
//
// Guarantees:
//
//   - A real server, never a fake. AdminDSN finds one once per process:
//     $TEST_DATABASE_URL, else $DATABASE_URL, else a server on 127.0.0.1:5432
//     (users $PGUSER, postgres, root), else a throwaway cluster it starts
//     from the installed binaries (initdb, pg_ctl, postgres; the highest
//     version found on PATH or in /usr/lib/postgresql/*/bin and similar).
//     PGTEST_FORCE_CLUSTER=1 skips straight to the throwaway cluster. Without
//     binaries or a server, the failure says how to install PostgreSQL and how
//     to set TEST_DATABASE_URL.
//   - Isolation: each NewDB is a database of its own, fully migrated with the
//     embedded migrations and otherwise empty, dropped WITH (FORCE) at the
//     test's cleanup. Tests that each use their own database may run in
//     parallel, within and across packages. A runnable example, which has
//     no testing.TB, gets one from ExampleDB and drops it when it returns.
//   - Speed: databases are cloned from a template database holding the
//     migrations. The template's name carries a hash of the migration files,
//     so editing a migration builds a new template; processes racing to build
//     it serialize on an advisory lock. Templates stay on the server for
//     later runs (drop stale ones by hand: ALTER DATABASE t IS_TEMPLATE false;
//     DROP DATABASE t).
//   - No leftovers: the throwaway cluster (trust authentication, 127.0.0.1
//     only, fsync off) lives in a temporary directory, is a child of the test
//     process and is stopped and deleted by Main. If the process dies first
//     (panic, -timeout, kill), Linux stops the server with it and the next
//     run deletes the directory. Main's extra checks (goleak) run after the
//     cluster is gone.
//   - Root: PostgreSQL refuses to run as root, so when the tests run as root
//     the binaries run as the OS user "postgres", which is given the
//     directories it needs.
//
// # PgBouncer
//
// NewPgBouncer starts a real PgBouncer (Debian's pgbouncer package) in
// transaction pooling mode in front of a test server, as a child of the test
// process on a free port (as the OS user "postgres" when running as root);
// NewPooledDB is NewDB behind one, returning the pooled URL (pgx's exec query
// mode) and the direct one. The pooler tests (docs/poolers.md) use them.
//
// Databases of a test killed before its cleanup remain on a shared server;
// they are named pgoutbox_t_<pid>_<random>_<n> and may be dropped at will.
// NewDB needs PostgreSQL 13 or later.
//
// This package is internal: it is test infrastructure, not a way to run
// PostgreSQL in production.
package pgtest
