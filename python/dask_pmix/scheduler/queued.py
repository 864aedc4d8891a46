"""Jobs whose rank tasks were submitted before the sidecar admitted them (submit_mpi), as the
scheduler holds them: each rank task is restricted to HOLD, a worker that never exists, so Dask
keeps it in no-worker (not queued, not sent anywhere) while the job waits in the sidecar's
admission line. Admitted, each is pinned to its member, gets the admitted job in its first
argument, and goes to processing; refused, all of them err with the sidecar's answer. No rank
task can run before its job's members are frozen: until then it has no worker it may run on.

Only the scheduler's own state is touched here, in one event-loop tick each time; the plugin
decides when."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..errors import MPIJobError
from ..protocol import HOLD, QUEUED_ANNOTATION


@dataclass
class Queued:
    ticket: str
    client: str
    request: dict  # create_job's keyword arguments
    keys: list  # the rank tasks' keys, in rank order
    # Done once this job's request waits in the sidecar's line (or was answered): the next job's
    # request goes then, so that requests enter the line in the order the jobs were submitted.
    in_line: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    task: asyncio.Future | None = None
    withdrawn: bool = False


def queued_jobs(annotations: dict) -> dict[str, tuple[list, dict, str | None]]:
    """ticket -> (its rank keys in rank order, the job's request, what is wrong with them or None),
    from update_graph's annotations."""
    marks = annotations.get(QUEUED_ANNOTATION) or {}
    by_ticket: dict[str, dict[int, tuple[Any, dict]]] = {}
    for key, mark in marks.items():
        if isinstance(mark, dict) and "ticket" in mark:
            by_ticket.setdefault(str(mark["ticket"]), {})[int(mark["rank"])] = (key, mark)
    found = {}
    for ticket, ranks in by_ticket.items():
        first = ranks[min(ranks)][1]
        keys = [ranks[r][0] for r in sorted(ranks)]
        wrong = None
        if sorted(ranks) != list(range(int(first.get("ranks") or 0))):
            wrong = f"the job's rank tasks came as ranks {sorted(ranks)} of {first.get('ranks')}"
        found[ticket] = (keys, dict(first.get("request") or {}), wrong)
    return found


def hold(scheduler, keys: list) -> None:
    """Before update_graph's transitions: the tasks may run nowhere (no-worker) until released."""
    for key in keys:
        ts = scheduler.tasks.get(key)
        if ts is not None:
            ts.worker_restrictions = {HOLD}
            ts.host_restrictions = None
            ts.loose_restrictions = False


def held(scheduler, keys: list) -> list:
    """The keys that are no longer held (cancelled, released, or somehow elsewhere)."""
    return [k for k in keys if (ts := scheduler.tasks.get(k)) is None or ts.state != "no-worker"]


def release(scheduler, keys: list, job: dict, envs: dict, stimulus_id: str) -> None:
    """Pins each held rank task to its member with the admitted job, and lets Dask schedule them
    (all in this tick: the members are frozen already)."""
    from dask._task_spec import Task

    workers = {m["rank"]: m["workerId"] for m in job.get("members") or ()}
    recommendations: dict = {}
    for rank, key in enumerate(keys):
        ts = scheduler.tasks[key]
        worker = workers[rank]
        old = ts.run_spec
        admission = {"job": job, "worker": worker, "env": envs.get(worker)}
        ts.run_spec = Task(key, old.func, admission, *old.args[1:], **old.kwargs)
        ts.worker_restrictions = {worker}
        recommendations[key] = "processing"
    scheduler.transitions(recommendations, stimulus_id)


def fail(scheduler, keys: list, error: MPIJobError, stimulus_id: str) -> None:
    """The held rank tasks err with `error` (their futures raise it; tasks that take them too)."""
    from distributed.protocol import pickle

    exception = pickle.dumps(error)
    recommendations: dict = {}
    for key in keys:
        ts = scheduler.tasks.get(key)
        if ts is not None and ts.state == "no-worker":
            recommendations.update(
                scheduler.transition(
                    key,
                    "erred",
                    exception=exception,
                    exception_text=str(error),
                    cause=key,
                    stimulus_id=stimulus_id,
                )
            )
    scheduler.transitions(recommendations, stimulus_id)
