// Package github is the GitHub App client of the release control plane: app
// JWTs (RS256), installation tokens cached in memory until a minute before
// they expire (never persisted, never logged, never in error text), and the
// REST calls the control plane's effects make — list/create/complete Check
// Runs, dispatch a workflow with return_run_details, list workflow runs.
//
// Every call sends X-GitHub-Api-Version (APIVersion) and goes to
// GITHUB_API_URL (DefaultAPIURL by default; GitHub Enterprise Server and the
// emulator in adapters/github/githubtest work the same way). Failures come back
// already classified as pgoutbox outcomes (see Client). Like every target,
// this package imports only the pgoutbox root package.
package github
