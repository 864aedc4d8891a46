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
    POOL_UP = "dask_pmix_pool_up"
    JOIN_JOB = "dask_pmix_join_job"
    LEAVE_JOB = "dask_pmix_leave_job"
    REPLACE_WORKER = "dask_pmix_replace_worker"
    # A process set's members (submit_mpi counts a pset job's ranks); its presence also says that
    # the plugin holds rank tasks submitted before their job's admission.
    PSET = "dask_pmix_pset"
    # Waits until Dask has removed the workers given (a job retried after a member was lost).
    WORKERS_GONE = "dask_pmix_workers_gone"
    # An elastic job's rank 0 at a commit: should its members change (scheduler/elastic.py)?
    ELASTIC_CHANGE = "dask_pmix_elastic_change"


# -- a job submitted before it is admitted (submit_mpi) ---------------------------------------------
#: The annotation on each rank task of a job that waits for admission: {"ticket", "rank", "ranks",
#: "request"}. The scheduler plugin holds those tasks (restricted to HOLD, a worker that does not
#: exist) until the sidecar admits the job, then pins each to its member and puts ADMISSION's place
#: in its arguments; or errs them with the sidecar's answer.
QUEUED_ANNOTATION = "dask_pmix_queued"
HOLD = "dask-pmix-waits-for-admission"
#: What a held rank task has for its first argument until it is admitted.
NOT_ADMITTED = {"dask-pmix": "not admitted"}


# -- elastic jobs (run_elastic): the labels of each generation's job on the sidecar ----------------
#: The elastic job (its family) that the generation belongs to: the scheduler's drains look for it.
ELASTIC_LABEL = "dask-pmix.elastic"
#: The generation's number, 0 first.
GENERATION_LABEL = "dask-pmix.generation"
#: What changed since the last generation ("+w" joined, "-w" left, "lost w"), for the dashboard.
CHANGE_LABEL = "dask-pmix.change"


# -- operations on Dask's batched streams -------------------------------------------------------------
class Stream:
    # scheduler -> worker: a job that has members on this worker changed ({"job": job})
    JOB = "dask-pmix-job"
    # scheduler -> worker: the embedded sidecar was restarted (a pool session made with the old one
    # cannot serve again)
    SIDECAR_RESTARTED = "dask-pmix-sidecar-restarted"
    # worker -> scheduler: this worker's plugin is installed and handles the operations above
    HELLO = "dask-pmix-hello"


# -- Dask events (scheduler -> the client that owns a job) -------------------------------------------
class Topic:
    JOB = "dask-pmix-job"
    # A job submitted before its admission (submit_mpi) that the sidecar runs in fork mode though
    # it was not asked to: {"id", "modeReason"}, for the client's MPIFallbackWarning.
    FALLBACK = "dask-pmix-fallback"


def job_view(job: dict) -> dict:
    """What members and clients are told of a job: its state, why, its library and mode, its labels (an elastic
    job's generation says so) and its members (each with why it left, when it did not finalize:
    errors.classify reads it)."""
    return {
        "id": job.get("id"),
        "state": job.get("state"),
        "labels": dict(job.get("labels") or {}),
        "error": job.get("error") or "",
        "impl": job.get("impl"),
        "mode": job.get("mode"),
        "timeoutSeconds": job.get("timeoutSeconds") or 0,
        "members": [
            {
                "workerId": m.get("workerId"),
                "rank": m.get("rank"),
                "state": m.get("state"),
                "reason": m.get("reason") or "",
                "endedJob": bool(m.get("endedJob")),
            }
            for m in job.get("members") or ()
        ],
    }


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
