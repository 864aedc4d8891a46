#!/usr/bin/env bash
# The test command: sets the checkout up (idempotent), then runs the whole suite.
# Extra arguments go to vitest, e.g. scripts/test.sh test/pmix
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
npx tsc -p tsconfig.json --noEmit
npx vitest run "$@"
