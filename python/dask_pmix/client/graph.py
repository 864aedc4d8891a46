"""The ranks of a job as one Dask graph: one task per rank, each pinned to its worker, ahead of the
tasks queued there, never retried."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

# Ranks go ahead of tasks queued on their workers: the other ranks are already waiting for them.
RANK_PRIORITY = 1_000_000


def submit_ranks(client, ranks: list[tuple[Any, str, Callable, tuple]]) -> list:
    """Futures in rank order of (key, worker, function, arguments); map_blocks_mpi's output blocks
    too, whose keys are the array's (tuples). All go to the scheduler as one
    graph: one update-graph message instead of one per rank (with Client.submit, the last rank's
    task started tens of ms after the first's at 8 ranks on a busy scheduler)."""
    try:
        from dask._task_spec import Task, parse_input
    except ImportError:  # a Dask without its task spec: one submit per rank
        return [
            client.submit(
                func,
                *args,
                key=key,
                workers=[worker],
                allow_other_workers=False,
                pure=False,
                retries=0,
                priority=RANK_PRIORITY,
            )
            for key, worker, func, args in ranks
        ]
    # One layer per rank: annotations (here, the worker) are per layer.
    return _submit_layers(
        client,
        [
            (key, Task(key, func, *(parse_input(a) for a in args)), {"workers": [worker]})
            for key, worker, func, args in ranks
        ],
    )


def submit_held_ranks(client, ranks: list[tuple[str, Callable, tuple, dict]]) -> list:
    """Futures in rank order of (key, function, arguments, mark): the ranks of a job that is not
    admitted yet, as one graph. Each task carries its mark (protocol.QUEUED_ANNOTATION: the
    ticket, the rank and the job's request), from which the scheduler plugin asks the sidecar for
    the job and holds the task until it is admitted; its worker restriction (HOLD, no worker)
    keeps it from running anywhere, even where the plugin is missing."""
    from dask._task_spec import Task, parse_input

    from ..protocol import HOLD, QUEUED_ANNOTATION

    return _submit_layers(
        client,
        [
            (key, Task(key, func, *(parse_input(a) for a in args)), {"workers": [HOLD], QUEUED_ANNOTATION: mark})
            for key, func, args, mark in ranks
        ],
    )


def _submit_layers(client, tasks: list[tuple[Any, Any, dict]]) -> list:
    """Futures in order of (key, task, annotations): one graph, one layer per task (annotations
    are per layer), ahead of the tasks queued on the workers."""
    from dask._expr import HLGExpr
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from distributed.spans import SpanMetadata

    layers = {key: MaterializedLayer({key: task}, annotations=annotations) for key, task, annotations in tasks}
    keys = [key for key, *_ in tasks]
    graph = HighLevelGraph(layers, {key: set() for key in keys})
    futures = client._graph_to_futures(
        HLGExpr(dsk=graph),
        keys,
        span_metadata=SpanMetadata(collections=[{"type": "Future"}]),
        internal_priority={key: 0 for key in keys},
        user_priority=RANK_PRIORITY,
        fifo_timeout="100 ms",
    )
    return [futures[key] for key in keys]


def pickled_function(fn: Callable) -> bytes:
    """The job's function, pickled once for all its ranks (by value where it must be: a lambda,
    or a function of __main__); the ranks' tasks carry these bytes (dask_pmix.member.task)."""
    import cloudpickle

    return cloudpickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)


def unpicklable(fn: Callable, args: tuple, kwargs: dict) -> str | None:
    """Which of the job's function and arguments cannot be pickled, said so that the caller can fix
    it (Dask's own error names only the graph). Looked for only after a submission failed."""
    import cloudpickle

    def fails(value: Any) -> str | None:
        try:
            cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return None

    for what, value in [
        ("the function", fn),
        *((f"argument {i + 1}", a) for i, a in enumerate(args)),
        *((f"keyword argument {k!r}", v) for k, v in kwargs.items()),
    ]:
        why = fails(value)
        if why:
            kind = f"{type(value).__module__}.{type(value).__qualname__}"
            return f"{what} of the MPI job (a {kind}) cannot be pickled ({why})"
    return None
