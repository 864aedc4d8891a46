"""The rank side of an elastic job (dask_pmix.run_elastic): the context ``fn`` gets, its sync
points, and the committed state each worker keeps between generations.

An elastic job is a chain of generations, each an ordinary in-process job over its members
(client/elastic.py starts them). ``fn(ctx, *args, **kwargs)`` runs in every generation: it starts
from ``ctx.state`` and calls ``ctx.commit(state)`` at points where every rank holds the same
state. A commit is collective: each member keeps the state (pickled, in its worker process), and
rank 0 asks the scheduler whether the membership should change (workers Dask is retiring, or idle
ones to take while the job is below its maximum: scheduler/elastic.py). When it should, every
rank leaves ``fn`` from that commit (ElasticChange, a BaseException, so that ``except Exception``
in user code does not swallow it) and the next generation starts over the new members, in the same
worker processes. Its members agree on the newest state any of them holds and take it from the
lowest rank that has it: a member that joins gets the survivors' state, and after a member was
lost the survivors go on from their last commit.
"""

from __future__ import annotations

import collections
import pickle
import threading
import time
import zlib
from typing import Any

import cloudpickle

from ..protocol import Scheduler
from ..worker import jobs, pool
from .ending import failed_ranks, is_mpi_error

#: Families whose committed state a worker keeps (the least recently committed goes first): a
#: worker is in one in-process job at a time, so a few cover elastic jobs that ended badly.
KEPT = 8
#: How long a member whose restored state did not arrive whole waits for its MPI library to name a
#: failed member (_lost_behind).
LOST_WAIT = 1.0


class _Store:
    """family -> (version, pickled state) in this worker process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: collections.OrderedDict[str, tuple[int, bytes]] = collections.OrderedDict()

    def get(self, family: str) -> tuple[int, bytes] | None:
        with self._lock:
            return self._held.get(family)

    def put(self, family: str, version: int, blob: bytes) -> None:
        with self._lock:
            self._held[family] = (version, blob)
            self._held.move_to_end(family)
            while len(self._held) > KEPT:
                self._held.popitem(last=False)

    def drop(self, family: str) -> None:
        with self._lock:
            self._held.pop(family, None)

    def families(self) -> list[str]:
        with self._lock:
            return list(self._held)


STORE = _Store()


class ElasticChange(BaseException):  # noqa: N818 - it is no error: the job goes on elsewhere
    """Leaves ``fn`` at a commit after which the members change (never seen by the caller)."""

    def __init__(self, change: dict) -> None:
        super().__init__(change)
        self.change = change


class ElasticContext:
    """What ``fn`` of an elastic job gets, in each generation:

    - ``comm``: the generation's communicator (mpi4py), over exactly its members;
    - ``rank``, ``size``: this member's rank and the number of members;
    - ``state``: the state to start from: the newest committed one (the job's initial state in its
      first generation);
    - ``version``: how many commits that state has behind it;
    - ``generation``: 0 for the first, one more at each change of membership;
    - ``workers``: the members' worker addresses, in rank order.
    """

    def __init__(self, comm, family: str, generation: int, limits: tuple[int, int], workers: list[str]) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.family = family
        self.generation = generation
        self.workers = workers
        self.state: Any = None
        self.version = 0
        self._limits = limits

    def commit(self, state: Any = None) -> None:
        """A sync point, on every rank at the same point of ``fn`` (collective): keeps ``state``
        (``ctx.state`` when None) as the state to go on from, then leaves ``fn`` if the members are
        to change. Each member keeps its own copy; the next generation takes the lowest rank's."""
        if state is not None:
            self.state = state
        self.version += 1
        STORE.put(self.family, self.version, cloudpickle.dumps(self.state))
        change = self._ask() if self.rank == 0 else None
        change = self.comm.bcast(change, root=0)
        if change:
            raise ElasticChange(change)

    def _ask(self) -> dict | None:
        """The scheduler's answer: {"leave": [...], "join": [...]} or nothing to change."""
        from distributed import get_worker
        from distributed.utils import sync

        worker = get_worker()
        lo, hi = self._limits
        try:
            answer = sync(
                worker.loop,
                getattr(worker.scheduler, Scheduler.ELASTIC_CHANGE),
                family=self.family,
                workers=self.workers,
                generation=self.generation,
                min=lo,
                max=hi,
            )
        except Exception:  # noqa: BLE001 - no answer is no change: the job goes on as it is
            return None
        return answer if isinstance(answer, dict) and (answer.get("leave") or answer.get("join")) else None


def restore(ctx: ElasticContext, initial: bytes) -> None:
    """Gives every member the newest state any of them holds (``initial`` when none holds one)."""
    from mpi4py import MPI

    held = STORE.get(ctx.family)
    version = held[0] if held is not None else -1
    newest, owner = ctx.comm.allreduce((version, -ctx.rank), op=MPI.MAX)
    owner = -owner
    if newest < 0:
        blob, newest = initial, 0
        state = pickle.loads(blob)
    else:
        mine = held[1] if ctx.rank == owner and held is not None else None
        try:
            crc, blob = ctx.comm.bcast((zlib.crc32(mine), mine) if mine is not None else None, root=owner)
            if zlib.crc32(blob) != crc:
                raise ValueError("the committed state arrived damaged (its checksum differs)")
            state = pickle.loads(blob)
        except Exception as exc:
            if is_mpi_error(exc):
                raise
            raise _lost_behind(ctx.comm, exc) from exc
    STORE.put(ctx.family, newest, blob)
    ctx.state, ctx.version = state, newest


def _lost_behind(comm, exc: Exception) -> Exception:
    """What to raise for ``exc``, a state that did not arrive whole: MPI_ERR_PROC_FAILED when a
    member failed meanwhile, as the MPI library comes to know within LOST_WAIT s, so that the job
    goes on without it, as after any lost member; else ``exc``. Seen once in 100 runs with two
    kills each (bench/elastic_kills.py): the owner of the state killed 8 ms into the generation,
    and a survivor's broadcast completed with zeros in place of the state. Looked at again at each
    change the scheduler pushes to this worker (the job's failure among them), not in a loop."""
    if isinstance(pool.current(), pool.World):
        return exc  # MPICH's worlds: no ULFM to name a failed member, the error stays as it is
    from mpi4py import MPI

    deadline = time.monotonic() + LOST_WAIT
    while True:
        seen = jobs.changes()
        if failed_ranks(comm):
            return MPI.Exception(MPI.ERR_PROC_FAILED)
        left = deadline - time.monotonic()
        if left <= 0:
            return exc
        jobs.wait_change(seen, left)


def rank_main(comm, spec: dict, fn: bytes, args: tuple, kwargs: dict) -> dict:
    """One member of one generation (run_mpi's fn): {"done": fn's value} or {"change": what the
    members agreed on}, with the version of the state it ends with."""
    from distributed import get_worker

    workers = comm.allgather(get_worker().address)
    ctx = ElasticContext(comm, spec["family"], spec["generation"], (spec["min"], spec["max"]), workers)
    restore(ctx, spec["initial"])
    user_fn = cloudpickle.loads(fn)
    try:
        value = user_fn(ctx, *args, **kwargs)
    except ElasticChange as c:
        return {"change": c.change, "version": ctx.version}
    STORE.drop(ctx.family)
    return {"done": value, "version": ctx.version}
