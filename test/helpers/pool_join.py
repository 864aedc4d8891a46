"""Joins the in-process pool as a Dask worker process does (dask_pmix.worker.pool: the MPI
session initialised with the environment the sidecar answered), then finalizes it. Prints the
session's state and rank as one JSON line. Usage: python pool_join.py ANSWER_JSON"""
import json
import sys

from dask_pmix.worker import pool

answer = json.loads(sys.argv[1])
pool.start(answer["pool"], answer["env"])
p = pool.current(120)
out = dict(pool.status())
out.pop("pool", None)
if p is not None:
    out.update(rank=p.world.Get_rank(), size=p.world.Get_size())
print(json.dumps(out), flush=True)
pool.close()
