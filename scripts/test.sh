#!/usr/bin/env bash
# The test command: sets the checkout up (idempotent), then runs the whole suite: the project's
# static checks (scripts/check.sh: lint, format, types, the addon with -Werror), the TypeScript
# and native tests (vitest), the docs build (warnings as errors, scripts/docs.sh), then the Dask
# end-to-end tests (pytest, the docs' examples among them) with Open MPI, then with MPICH, then the
# perf guard (short runs of the benchmarks; fails when a ratio against the reference falls
# below half its record in bench/results; DASK_PMIX_PERF_GUARD=0 skips it).
# Arguments go to vitest and skip pytest and the guard, e.g. scripts/test.sh test/pmix
# Each phase's wall time goes to stderr ("[test] pytest-openmpi 842 s"): the suite has a budget.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# phase NAME CMD...: runs CMD and says how long it took.
phase() {
  local name="$1" t0=$SECONDS; shift
  "$@"
  echo "[test] $name $((SECONDS - t0)) s" >&2
}
phase setup scripts/setup.sh
if [ $# -eq 0 ]; then
  phase check scripts/check.sh
else
  npx tsc -p tsconfig.json --noEmit
fi
phase vitest npx vitest run "$@"
if [ $# -eq 0 ]; then
  phase docs scripts/docs.sh
  phase pytest-openmpi .venv/bin/python -m pytest -q -p no:cacheprovider --durations=12 python/tests
  phase pytest-mpich env DASK_PMIX_TEST_IMPL=mpich .venv-mpich/bin/python -m pytest -q -p no:cacheprovider --durations=12 python/tests
  [ "${DASK_PMIX_PERF_GUARD:-1}" = 0 ] || phase perf-guard node dist/bench/guard.js
  echo "[test] all $SECONDS s" >&2
fi
