#!/usr/bin/env bash
# Builds the dask-pmix wheel: the Python package with the built sidecar inside it
# (dask_pmix/_sidecar/: the compiled JavaScript, the native addon, the runtime node_modules), so
# that one `pip install` brings everything. Writes dist/wheel/dask_pmix-<version>-py3-none-<plat>.whl
# (or into $1) and prints its path. Runs setup first (idempotent).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/dist/wheel}" && cd "${1:-$ROOT/dist/wheel}" && pwd)"
DASK_PMIX_SETUP_QUIET="${DASK_PMIX_SETUP_QUIET:-1}" "$ROOT/scripts/setup.sh"

# The sidecar's runtime modules (no dev dependencies), once per lock file.
LOCK_KEY="$(cat "$ROOT/package.json" "$ROOT/package-lock.json" | sha256sum | cut -c1-16)"
MODULES="$ROOT/.deps/sidecar-modules/$LOCK_KEY"
if [ ! -d "$MODULES/node_modules" ]; then
  rm -rf "$ROOT/.deps/sidecar-modules" && mkdir -p "$MODULES"
  cp "$ROOT/package.json" "$ROOT/package-lock.json" "$MODULES/"
  (cd "$MODULES" && npm ci --omit=dev --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error >/dev/null)
  rm -rf "$MODULES/node_modules/.bin"
  # Native modules' install scripts do not run here: take the binaries setup built.
  for m in better-sqlite3; do
    mkdir -p "$MODULES/node_modules/$m/build/Release"
    cp "$ROOT/node_modules/$m/build/Release/"*.node "$MODULES/node_modules/$m/build/Release/"
  done
fi

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
cp "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py" "$STAGE/"
(cd "$ROOT/python" && find dask_pmix -name __pycache__ -prune -o -name _sidecar -prune -o -type f -print0 \
  | xargs -0 cp --parents -t "$STAGE")
S="$STAGE/dask_pmix/_sidecar"
mkdir -p "$S/dist" "$S/native/build/Release"
(cd "$ROOT/dist" && find src -name '*.js' -print0 | xargs -0 cp --parents -t "$S/dist")
cp "$ROOT/native/build/Release/dask_pmix_native.node" "$S/native/build/Release/"
# The binder behind `dask-pmix exec` (native/exec): a plain program starts without Node.js.
cp "$ROOT/native/build/Release/dask-pmix-exec" "$S/native/build/Release/"
cp -r "$MODULES/node_modules" "$S/node_modules"
# ESM, and the marker by which the sidecar finds its root.
printf '{\n  "name": "dask-pmix-sidecar",\n  "private": true,\n  "type": "module"\n}\n' > "$S/package.json"

rm -f "$OUT"/dask_pmix-*.whl
"$ROOT/.venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$OUT" "$STAGE" >&2
ls "$OUT"/dask_pmix-*.whl
