"""Run MPI jobs on the workers of a running Dask cluster, through the dask-pmix sidecar.

    client.register_plugin(dask_pmix.SidecarPlugin())      # or: dask scheduler --preload dask_pmix
    sums = dask_pmix.run_mpi(client, fn, n=3)              # fn(comm) on 3 workers, rank order

Importing the package is cheap: its attributes are loaded on first use (PEP 562), so a process
that needs one part (a plain MPI rank's `python -m dask_pmix.pmi_connect`, the CLI) does not pay
for distributed and the rest.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

__version__ = (Path(__file__).resolve().parent / "VERSION").read_text().strip()

# public name -> (module, attribute); None: the module itself
_LAZY: dict[str, tuple[str, str | None]] = {
    "run_mpi": ("dask_pmix.client.run", "run_mpi"),
    "submit_mpi": ("dask_pmix.client.run", "submit_mpi"),
    "run_elastic": ("dask_pmix.client.elastic", "run_elastic"),
    "ElasticContext": ("dask_pmix.member.elastic", "ElasticContext"),
    "map_blocks_mpi": ("dask_pmix.client.collections", "map_blocks_mpi"),
    "map_partitions_mpi": ("dask_pmix.client.collections", "map_partitions_mpi"),
    "Partitions": ("dask_pmix.blocks", "Partitions"),
    "Partition": ("dask_pmix.blocks", "Partition"),
    "Blocks": ("dask_pmix.blocks", "Blocks"),
    "Block": ("dask_pmix.blocks", "Block"),
    "Layout": ("dask_pmix.blocks", "Layout"),
    "Slab": ("dask_pmix.blocks", "Slab"),
    "wait_for_plugin": ("dask_pmix.client.plugin_check", "wait_for_plugin"),
    "SidecarPlugin": ("dask_pmix.scheduler.plugin", "SidecarPlugin"),
    "dask_setup": ("dask_pmix.scheduler.plugin", "dask_setup"),
    "PoolPlugin": ("dask_pmix.worker.plugin", "PoolPlugin"),
    "comm_stats": ("dask_pmix.comm.stats", "comm_stats"),
    "SidecarClient": ("dask_pmix.rest", "SidecarClient"),
    "MPIJobError": ("dask_pmix.errors", "MPIJobError"),
    "SidecarError": ("dask_pmix.errors", "SidecarError"),
    "MPIFallbackWarning": ("dask_pmix.errors", "MPIFallbackWarning"),
}

__all__ = sorted([*_LAZY, "__version__"])


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'dask_pmix' has no attribute {name!r}") from None
    mod = importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if TYPE_CHECKING:
    from . import comm as comm
    from . import pool as pool
    from .blocks import Block as Block
    from .blocks import Blocks as Blocks
    from .blocks import Layout as Layout
    from .blocks import Partition as Partition
    from .blocks import Partitions as Partitions
    from .blocks import Slab as Slab
    from .client.collections import map_blocks_mpi as map_blocks_mpi
    from .client.collections import map_partitions_mpi as map_partitions_mpi
    from .client.elastic import run_elastic as run_elastic
    from .client.plugin_check import wait_for_plugin as wait_for_plugin
    from .client.run import run_mpi as run_mpi
    from .client.run import submit_mpi as submit_mpi
    from .comm.stats import comm_stats as comm_stats
    from .errors import MPIFallbackWarning as MPIFallbackWarning
    from .errors import MPIJobError as MPIJobError
    from .errors import SidecarError as SidecarError
    from .member.elastic import ElasticContext as ElasticContext
    from .rest import SidecarClient as SidecarClient
    from .scheduler.plugin import SidecarPlugin as SidecarPlugin
    from .scheduler.plugin import dask_setup as dask_setup
    from .worker.plugin import PoolPlugin as PoolPlugin
