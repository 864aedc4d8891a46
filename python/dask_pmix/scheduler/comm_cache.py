"""Which in-process jobs build their communicator anew and which derive it from one kept from an
earlier job (the communicator cache, issue 29).

Building a job's communicator with MPI_Comm_create_from_group is a PMIx group construct through
the sidecar (about 2.5 ms alone, more beside the job's other traffic), and libpmix 5.0.x keeps
part of every group construct and destruct in the server for good: each member's copy of the
member list, about 0.5 KB per member per member (8 KB for a job of 4, 130 KB for 16;
docs/operations/sidecar.md). A communicator derived from one the members already share is a
context id agreed among them (about 0.14 ms) and reaches no PMIx server. So the members of a job
keep the communicator they built, and a later job whose workers are all among a kept one's
derives its own from it:

- over the same workers in the same rank order, MPI_Comm_dup;
- over the same workers in another order, or some of them, MPI_Comm_create_group with those
  ranks in the job's order (collective over them only: the kept communicator's other members
  take no part, and may be in other jobs meanwhile).

Every member must take the same path (a Dup waits for the Dup of every other member, a group
construct for theirs), so the choice is made here, once per job, when its members meet at the
join barrier, and each member gets the same plan in its join answer:

- ``use``: the id of a kept communicator each member derives the job's from; with ``ranks``,
  the kept communicator's ranks of the job's members in job rank order (MPI_Comm_create_group),
  without it a Dup (the job's communicator is freed at the job's end as before);
- ``keep``: build anew and keep the result under this id (the job's communicator is a duplicate
  of it too: code in the job can never free or revoke the kept one);
- neither: build anew, keep nothing (the cache is off, full of busy entries, or the plugin does not
  know the job's members);
- ``live``: every id still kept: a member frees whatever else it holds.

Of the kept communicators that hold every worker of a job, the one over exactly its workers in its
order comes first, then the one with the fewest members (leaving larger ones to other jobs). A
kept communicator serves one job at a time (two jobs deriving from one at once could overlap: the
second builds anew and keeps nothing). It serves again only once its job has completed; it is
dropped when a job on it fails or is aborted, when any of its members leaves the pool or the
cluster, when the sidecar restarts, and, least recently used first, beyond
``dask-pmix.pool.comm-cache`` entries (idle ones only).

The sidecar still admits and freezes every job; it does not see a derived communicator, so the
plugin tells it that a job built from a kept communicator runs (SidecarPlugin.join_job).

Plain Python on the scheduler's event loop: no I/O, no locks."""

from __future__ import annotations

import collections
from dataclasses import dataclass

# Plans remembered for jobs still running (or whose end the plugin has not seen).
PLANS_KEPT = 4096
# What the cache did lately (for tests and the curious): ("plan", job, use, keep), ("end", job,
# completed), ("drop", id, why).
HISTORY = 1024


@dataclass
class Kept:
    id: str  # the job that built it
    key: tuple[str, ...]  # its members' workers, in rank order
    busy: str | None  # the job building it or duplicating it now
    ready: bool = False  # its builder completed: it may serve
    uses: int = 0  # jobs that duplicated it


class CommCache:
    def __init__(self, bound: int = 16) -> None:
        self.bound = max(0, int(bound))
        self._kept: collections.OrderedDict[tuple[str, ...], Kept] = collections.OrderedDict()  # LRU first
        self._plans: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._on: dict[str, tuple[str, ...]] = {}  # job -> the key of the entry it builds or uses
        self.counts: collections.Counter[str] = collections.Counter()
        self.history: collections.deque[tuple] = collections.deque(maxlen=HISTORY)
        self.recorded = 0  # entries ever appended to history

    def plan(self, job_id: str, workers: list[str] | None) -> tuple[dict, bool]:
        """The job's plan (the same at every call) and whether it was made now. ``workers``: the
        job's members in rank order, None when the plugin does not know the job or it has ended
        (then it builds anew and keeps nothing)."""
        made = self._plans.get(job_id)
        if made is not None:
            return made, False
        use = keep = ranks = None
        if workers and self.bound > 0:
            key = tuple(workers)
            e = self._covering(key)
            if e is not None:
                e.busy, use = job_id, e.id
                e.uses += 1
                self._kept.move_to_end(e.key)
                self._on[job_id] = e.key
                self.counts["reused"] += 1
                if e.key != key:
                    ranks = [e.key.index(w) for w in key]
                    self.counts["derived"] += 1
            elif key in self._kept:
                self.counts["busy"] += 1  # another job holds it: this one builds its own
            elif self._room():
                self._kept[key] = Kept(job_id, key, busy=job_id)
                self._on[job_id] = key
                keep = job_id
                self.counts["kept"] += 1
            else:
                self.counts["full"] += 1
        if use is None:
            self.counts["built"] += 1
        plan: dict = {"use": use, "keep": keep, "live": [e.id for e in self._kept.values()]}
        if ranks is not None:
            plan["ranks"] = ranks
        self._record(("plan", job_id, use, keep))
        self._plans[job_id] = plan
        while len(self._plans) > PLANS_KEPT:
            self._plans.popitem(last=False)
        return plan, True

    def _covering(self, key: tuple[str, ...]) -> Kept | None:
        """The idle kept communicator to derive a job over ``key`` from: the one over exactly
        these workers in this order, else the smallest that holds them all (the most recently
        used of equals), else None."""
        e = self._kept.get(key)
        if e is not None and e.ready and e.busy is None:
            return e
        want = set(key)
        best = None
        for e in reversed(self._kept.values()):
            if e.ready and e.busy is None and len(e.key) >= len(want) and want.issubset(e.key):
                if best is None or len(e.key) < len(best.key):
                    best = e
        return best

    def _room(self) -> bool:
        """Makes room for one more entry (evicting the least recently used idle ones)."""
        if len(self._kept) < self.bound:
            return True
        for key, e in list(self._kept.items()):
            if len(self._kept) < self.bound:
                break
            if e.busy is None:
                self._drop(key, "evicted")
        return len(self._kept) < self.bound

    def job_ended(self, job_id: str, completed: bool) -> None:
        """The job ended: its entry serves again (completed) or is dropped (failed, aborted)."""
        self._plans.pop(job_id, None)
        key = self._on.pop(job_id, None)
        e = self._kept.get(key) if key is not None else None
        if e is None or e.busy != job_id:
            return
        self._record(("end", job_id, completed))
        if completed:
            e.busy, e.ready = None, True
        else:
            self._drop(key, "failed")  # type: ignore[arg-type]

    def worker_left(self, worker: str) -> None:
        """A worker left the pool or the cluster: no communicator with it serves again."""
        for key in [k for k in self._kept if worker in k]:
            self._drop(key, "member left")

    def clear(self, why: str = "cleared") -> None:
        for key in list(self._kept):
            self._drop(key, why)

    def _drop(self, key: tuple[str, ...], why: str) -> None:
        e = self._kept.pop(key, None)
        if e is not None:
            self.counts[f"dropped: {why}"] += 1
            self._record(("drop", e.id, why))
            if e.busy is not None and self._on.get(e.busy) == key:
                del self._on[e.busy]

    def _record(self, what: tuple) -> None:
        self.history.append(what)
        self.recorded += 1

    def view(self) -> dict:
        """What is kept now, and the counts so far (for tests and the curious)."""
        return {
            "bound": self.bound,
            "kept": [
                {"id": e.id, "workers": list(e.key), "busy": e.busy, "ready": e.ready, "uses": e.uses}
                for e in self._kept.values()
            ],
            "counts": dict(self.counts),
            "history": [list(h) for h in self.history],
            "history_from": self.recorded - len(self.history),  # the number of history's first entry
        }
