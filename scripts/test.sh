#!/usr/bin/env bash
# The test command: sets the checkout up (idempotent), then runs the whole suite: the project's
# static checks (scripts/check.sh: lint, format, types, the addon with -Werror), the TypeScript
# and native tests (vitest), the docs build (warnings as errors, scripts/docs.sh), then the Dask
# end-to-end tests (pytest, the docs' examples among them) with Open MPI, then with MPICH, then the
# perf guard (short runs of the benchmarks; fails when a ratio against the reference falls
# below half its record in bench/results; DASK_PMIX_PERF_GUARD=0 skips it).
# Arguments go to vitest and skip pytest and the guard, e.g. scripts/test.sh test/pmix
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh
if [ $# -eq 0 ]; then
  scripts/check.sh
else
  npx tsc -p tsconfig.json --noEmit
fi
npx vitest run "$@"
if [ $# -eq 0 ]; then
  scripts/docs.sh
  .venv/bin/python -m pytest -q -p no:cacheprovider python/tests
  DASK_PMIX_TEST_IMPL=mpich .venv-mpich/bin/python -m pytest -q -p no:cacheprovider python/tests
  [ "${DASK_PMIX_PERF_GUARD:-1}" = 0 ] || node dist/bench/guard.js
fi
