#!/usr/bin/env bash
# Builds the docs (Sphinx, pydata theme) into docs/_build/html with warnings as errors, after
# generating their pages of record: the configuration table (dask-pmix.yaml), the REST reference
# (the OpenAPI document), the compatibility matrix and mpi4py's suite (compat-matrix/results) and
# the performance figures (bench/results). Internal links and anchors are checked by the build
# itself; external links are never fetched. Needs scripts/setup.sh to have run (the test command
# runs it first).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY=.venv-docs/bin/python
GEN=docs/_generated
rm -rf "$GEN" docs/_build
mkdir -p "$GEN"
"$PY" docs/gen/config_table.py > "$GEN/config.md"
"$PY" docs/gen/perf.py "$GEN"
"$PY" docs/gen/mpi4py_suite.py > "$GEN/mpi4py-suite.md"
node dist/src/cli/main.js openapi > "$GEN/openapi.json"
node --input-type=module -e "
  const { writeMatrix } = await import('$ROOT/dist/compat-matrix/report.js');
  writeMatrix('compat-matrix/results', '$GEN/compat.md');"
"$PY" docs/gen/readme.py --check
"$PY" -m sphinx -W --keep-going -q -b html docs docs/_build/html
echo "[docs] built docs/_build/html"
