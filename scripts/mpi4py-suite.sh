#!/usr/bin/env bash
# mpi4py's own test suite, module by module, under the library's mpiexec, in process and in fork
# mode, in one run (compat-matrix/mpi4py_suite/run.py); writes
# compat-matrix/results/mpi4py-suite-IMPL.json, which docs/gen/mpi4py_suite.py turns into the table
# of docs/compatibility.md (scripts/docs.sh). Runs under nice: the machine is shared.
#   scripts/mpi4py-suite.sh [--impl openmpi|mpich] [--modules test_comm,test_op] [--quick]
#                           [--configs mpiexec,inprocess,fork] [--timeout 240] [--out FILE]
# --modules and --quick write to compat-matrix/.work/ unless --out says otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
impl=openmpi
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --impl) impl="${args[$((i + 1))]}" ;;
    --impl=*) impl="${args[$i]#--impl=}" ;;
  esac
done
case "$impl" in
  openmpi) PY=.venv/bin/python ;;
  mpich) PY=.venv-mpich/bin/python ;;
  *) echo "unknown --impl $impl (openmpi or mpich)" >&2; exit 2 ;;
esac
exec nice "$PY" compat-matrix/mpi4py_suite/run.py "$@"
