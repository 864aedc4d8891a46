"""``dask_pmix.pool``: the worker-side API of the in-process pool, which lives in
dask_pmix.worker.pool (this name is the same module object)."""

import sys

from .worker import pool as _pool

sys.modules[__name__] = _pool
