#!/usr/bin/env bash
# Runs every fuzz target of the reliability campaign (issue 9) for a fixed
# time each: FUZZTIME (default 30s), FUZZ_PARALLEL workers (default 2).
# A crash stops the run and leaves the failing input under the package's
# testdata/fuzz/<Target>/; commit it as a regression case.
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZTIME="${FUZZTIME:-30s}"
FUZZ_PARALLEL="${FUZZ_PARALLEL:-2}"
targets=(
  ".:FuzzPayloadCredentialGuard"
  ".:FuzzIsCredentialKey"
  ".:FuzzSQLCredentialGuard"
  ".:FuzzSQLIsCredentialKey"
  "./controlplane/webhook:FuzzVerify"
  "./controlplane/webhook:FuzzNormalize"
  "./projection:FuzzImportNDJSON"
  "./projection:FuzzImportJSONArray"
  "./projection:FuzzImportCSV"
  "./internal/ops:FuzzFilterIsLiteral"
)
for t in "${targets[@]}"; do
  pkg="${t%%:*}" name="${t##*:}"
  echo "== $name ($pkg, $FUZZTIME)"
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -parallel "$FUZZ_PARALLEL" "$pkg"
done
