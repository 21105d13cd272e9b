// Package demo is `pgoutbox demo`: the whole system working on one machine.
// It runs the HTTP server, the engine and both applications against a real
// PostgreSQL, with the GitHub and Solr emulators in-process, and drives a
// story through the real HTTP endpoints:
//
//   - the release control plane: an installation with two repositories, a
//     tag push per repository (signed webhooks), Check Runs created,
//     workflows dispatched, workflow runs completed by the emulator and their
//     webhooks delivered, Check Runs concluded; one dispatch whose response
//     the emulator loses, which lands in reconciliation_required;
//   - the record projection: an NDJSON import of a few thousand records
//     projected to the Solr emulator (and to a SPARQL store when one is
//     given), through a burst of 503s that is retried, with one poisoned
//     record that dead-letters.
//
// Every run uses fresh tags, commits and record contents, so a second run on
// the same database tells its own story; the summary counts only this run's
// effects. This is the only runtime package that imports the emulators (adapters/github/githubtest, adapters/solr/solrtest).
package demo
