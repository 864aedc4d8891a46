"""Names and state sets that the client, the scheduler plugin, the workers and the members share.

Every side imports them from here, so that the path of a message can be followed by name: a
scheduler handler, a worker handler, a stream operation or an event topic is defined once. The
job and member states are those of the data model of record (proto/dask_pmix.proto)."""

from __future__ import annotations

import importlib
import re
from typing import Any

# -- plugins ---------------------------------------------------------------------------------------
SCHEDULER_PLUGIN = "dask-pmix"
WORKER_PLUGIN = "dask-pmix-pool"

# -- job states (proto: JobState) -------------------------------------------------------------------
ACTIVE_STATES = frozenset({"pending", "wiring", "running"})
FAILED_STATES = frozenset({"failed", "aborted"})
ENDED_STATES = frozenset({"completed", "failed", "aborted"})

# -- member states (proto: MemberState) --------------------------------------------------------------
MEMBER_CONNECTED = "connected"
MEMBER_LOST = "lost"

# -- the task of each rank: its key names its job --------------------------------------------------
RANK_KEY = re.compile(r"^dask-pmix-(.+)-rank-(\d+)$")


def rank_key(job_id: str, rank: int) -> str:
    return f"dask-pmix-{job_id}-rank-{rank}"


# -- scheduler handlers (RPC from clients and workers) ----------------------------------------------
class Scheduler:
    INFO = "dask_pmix_info"
    CREATE_JOB = "dask_pmix_create_job"
    JOB = "dask_pmix_job"
    RELEASE_JOB = "dask_pmix_release_job"
    MEMBER_LOST = "dask_pmix_member_lost"
    JOIN_POOL = "dask_pmix_join_pool"
    LEAVE_POOL = "dask_pmix_leave_pool"
    JOIN_JOB = "dask_pmix_join_job"
    LEAVE_JOB = "dask_pmix_leave_job"
    RESTART_WORKER = "dask_pmix_restart_worker"


# -- worker handlers (RPC from the scheduler) --------------------------------------------------------
class Worker:
    MEMBER_RUNNING = "dask_pmix_member_running"


# -- objects sent by reference ------------------------------------------------------------------
class Remote:
    """An object built where it is unpickled: ``Remote("pkg.module:Class", **kwargs)`` pickles as a
    call of that class with those arguments, so that one side can send an object of the other's
    code (the scheduler, the worker plugin) without importing that code itself."""

    def __init__(self, target: str, **kwargs: Any):
        self.target = target
        self.kwargs = kwargs

    def __reduce__(self):
        return (_build, (self.target, self.kwargs))


def _build(target: str, kwargs: dict) -> Any:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(**kwargs)


class Call:
    """A function called by its import path where it runs: ``Call("pkg.module:fn")(*args)``. It
    pickles as that path, so a client can name a task function of the worker's code."""

    __slots__ = ("target", "__name__")

    def __init__(self, target: str):
        self.target = target
        self.__name__ = target.rsplit(":", 1)[-1]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    def __reduce__(self):
        return (Call, (self.target,))

    def __repr__(self) -> str:
        return f"Call({self.target!r})"
