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
- ``shrink`` (with ``use`` and ``keep``): MPI_Comm_shrink of kept ``use``, kept under ``keep``,
  the job's communicator derived from that (below);
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

A job over exactly a kept communicator's members (Open MPI) that failed because some of them died
leaves it shrinkable instead of dropped, when the sidecar named every dead member to the survivors'
MPI library (their PMIx connection dropped while the job ran: the sidecar then sends the job's end
with them as the failed processes, dask_pmix's pmix-pool.ts). MPI_Comm_shrink of it is an
agreement among the survivors (1.5 ms at 3), with no PMIx group construct, and the kept
communicator is the only one every survivor still shares: after a failure, a new group construct
over the survivors was where a second death hung libpmix 5.0.11's tracker for good (issue 28).
Shrinking needs every living member of the communicator, so it serves only a job over exactly
its survivors; that job's shrunk communicator replaces it (one that fails the same way leaves
the parent shrinkable with the new dead added).

The sidecar still admits and freezes every job; it does not see a derived communicator, so the
plugin tells it that a job built from a kept communicator runs (SidecarPlugin.join_job).

Plain Python on the scheduler's event loop: no I/O, no locks."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from ..errors import POOL_PROCESS_DIED, lost_members

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
    dead: frozenset[str] = frozenset()  # members dead and known so to the others' MPI (shrinkable)
    left: frozenset[str] = frozenset()  # members that left the pool while a job ran on it


def named_dead(view: dict) -> frozenset[str]:
    """The workers of an ended in-process Open MPI job whose processes died while it ran, each named
    to the surviving members' MPI library as a failed process (what makes a communicator with them
    shrinkable); empty for any other job."""
    if view.get("impl") != "openmpi" or view.get("mode") != "inprocess":
        return frozenset()
    return lost_members(view, lambda reason: reason.startswith(POOL_PROCESS_DIED))


@dataclass
class On:
    """What a planned job does with the cache until its end."""

    key: tuple[str, ...]  # the entry it builds or uses (for a shrink: the one it shrinks to)
    whole: bool  # it runs over all of that entry's members
    parent: tuple[str, ...] | None = None  # a shrink: the entry it shrinks


class CommCache:
    def __init__(self, bound: int = 16) -> None:
        self.bound = max(0, int(bound))
        self._kept: collections.OrderedDict[tuple[str, ...], Kept] = collections.OrderedDict()  # LRU first
        self._plans: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._on: dict[str, On] = {}  # planned job -> what it does with the cache
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
        shrink = False
        if workers and self.bound > 0:
            key = tuple(workers)
            e = self._covering(key)
            s = self._shrinkable(key) if e is None else None
            if s is not None:
                survivors = tuple(w for w in s.key if w not in s.dead)
                s.busy, use, keep, shrink = job_id, s.id, job_id, True
                self._kept[survivors] = Kept(job_id, survivors, busy=job_id)
                self._on[job_id] = On(survivors, whole=True, parent=s.key)
                self.counts["shrunk"] += 1
                if survivors != key:
                    ranks = [survivors.index(w) for w in key]
            elif e is not None:
                e.busy, use = job_id, e.id
                e.uses += 1
                self._kept.move_to_end(e.key)
                self._on[job_id] = On(e.key, whole=set(e.key) == set(key))
                self.counts["reused"] += 1
                if e.key != key:
                    ranks = [e.key.index(w) for w in key]
                    self.counts["derived"] += 1
            elif key in self._kept:
                self.counts["busy"] += 1  # another job holds it: this one builds its own
            elif self._room():
                self._kept[key] = Kept(job_id, key, busy=job_id)
                self._on[job_id] = On(key, whole=True)
                keep = job_id
                self.counts["kept"] += 1
            else:
                self.counts["full"] += 1
        if use is None:
            self.counts["built"] += 1
        plan: dict = {"use": use, "keep": keep, "live": [e.id for e in self._kept.values()]}
        if shrink:
            plan["shrink"] = True
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
        if e is not None and e.ready and e.busy is None and not e.dead:
            return e
        want = set(key)
        best = None
        for e in reversed(self._kept.values()):
            if e.ready and e.busy is None and not e.dead and len(e.key) >= len(want) and want.issubset(e.key):
                if best is None or len(e.key) < len(best.key):
                    best = e
        return best

    def _shrinkable(self, key: tuple[str, ...]) -> Kept | None:
        """An idle kept communicator whose living members are exactly ``key``'s workers."""
        if key in self._kept:
            return None  # its shrunk one would take the key of a communicator kept already
        want = set(key)
        return next(
            (e for e in self._kept.values() if e.dead and e.ready and e.busy is None and set(e.key) - e.dead == want),
            None,
        )

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

    def job_ended(self, job_id: str, completed: bool, dead: frozenset[str] = frozenset()) -> None:
        """The job ended: its entry serves again (completed) or is dropped (failed, aborted), or,
        failed with ``dead`` members (dead, and named to the others' MPI), is left shrinkable
        when the job ran over exactly its members."""
        self._plans.pop(job_id, None)
        on = self._on.pop(job_id, None)
        if on is None:
            return
        if on.parent is not None:
            self._shrink_ended(job_id, on, completed, dead)
            return
        e = self._kept.get(on.key)
        if e is None or e.busy != job_id:
            return
        self._record(("end", job_id, completed))
        if completed and not e.left:
            e.busy, e.ready = None, True
        elif not completed and on.whole and self._mark_dead(e, dead):
            e.busy = None
        else:
            self._drop(on.key, "failed" if not completed else "member left")

    def _shrink_ended(self, job_id: str, on: On, completed: bool, dead: frozenset[str]) -> None:
        """A job that shrank a kept communicator ended: the shrunk one replaces it (completed), or
        goes, leaving the parent shrinkable with the new dead added when there are some."""
        self._record(("end", job_id, completed))
        parent = self._kept.get(on.parent)  # type: ignore[arg-type]
        if parent is not None and parent.busy == job_id:
            parent.busy = None
            if completed:
                self._drop(parent.key, "shrunk")
            elif not self._mark_dead(parent, dead):
                self._drop(parent.key, "failed")
        shrunk = self._kept.get(on.key)
        if shrunk is not None and shrunk.busy == job_id:
            if completed and not shrunk.left:
                shrunk.busy, shrunk.ready = None, True
            else:
                self._drop(on.key, "failed")

    def _mark_dead(self, e: Kept, dead: frozenset[str]) -> bool:
        """Whether ``e`` becomes (or stays) shrinkable with ``dead`` added to its dead: every
        member that left is among them, and some member survives."""
        now = e.dead | (dead & set(e.key))
        if now == e.dead or not e.left <= now or len(now) >= len(e.key):
            return False
        e.dead, e.left = frozenset(now), frozenset()
        self.counts["shrinkable"] += 1
        self._record(("shrinkable", e.id, sorted(now)))
        return True

    def worker_left(self, worker: str) -> None:
        """A worker left the pool or the cluster: no communicator with it serves again."""
        for key in [k for k in self._kept if worker in k]:
            e = self._kept[key]
            if worker in e.dead:
                continue  # shrinkable without it
            if e.busy is not None:
                # Its job's end decides (this worker may be one of the dead it names).
                e.left = e.left | {worker}
                continue
            self._drop(key, "member left")

    def clear(self, why: str = "cleared") -> None:
        for key in list(self._kept):
            self._drop(key, why)
        self._on.clear()

    def _drop(self, key: tuple[str, ...], why: str) -> None:
        e = self._kept.pop(key, None)
        if e is not None:
            self.counts[f"dropped: {why}"] += 1
            self._record(("drop", e.id, why))
            on = self._on.get(e.busy) if e.busy is not None else None
            if on is not None and on.key == key:
                del self._on[e.busy]  # type: ignore[arg-type]

    def _record(self, what: tuple) -> None:
        self.history.append(what)
        self.recorded += 1

    def view(self) -> dict:
        """What is kept now, and the counts so far (for tests and the curious)."""
        return {
            "bound": self.bound,
            "kept": [
                {
                    "id": e.id,
                    "workers": list(e.key),
                    "busy": e.busy,
                    "ready": e.ready,
                    "uses": e.uses,
                    "dead": sorted(e.dead),
                }
                for e in self._kept.values()
            ],
            "counts": dict(self.counts),
            "history": [list(h) for h in self.history],
            "history_from": self.recorded - len(self.history),  # the number of history's first entry
        }
