"""One rank of the reference run: `mpiexec -n N python ref_rank.py TESTDIR MODULE OUTDIR`.

mpi4py initialises MPI at import as it does for its own CI (MPI_Init_thread, THREAD_MULTIPLE);
the module runs through collect.run_module, as in the dask-pmix configurations; each rank writes
OUTDIR/rank-R.json and appends its progress to OUTDIR/rank-R.log."""

import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import collect  # noqa: E402

testdir, module, outdir = sys.argv[1:4]
exclude = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[4] else None
from mpi4py import MPI  # noqa: E402

rank = MPI.COMM_WORLD.Get_rank()
result = collect.run_module(testdir, module, os.path.join(outdir, f"rank-{rank}.log"), exclude=exclude)
with open(os.path.join(outdir, f"rank-{rank}.json"), "w") as f:
    json.dump(result, f)
