"""Communicators between two pool ranks, built once per pair of processes and shared by every
Dask connection between them.

One communicator per worker pair, not one per pool generation (measured in bench/comm.py, see
README): Comm_create_from_group is collective over its group, so a generation-wide communicator
needs every worker of the pool to call it at the same time (a worker that joins later, one that is
busy or dead, holds up everyone), while a pair's creation involves only the two processes that are
connecting anyway. The cost, a PMIx group construct, is paid once per pair of processes (the first
connection); later connections only allocate a tag. A pair's communicator is private to the
backend (its own PMIx group and context id), so user MPI jobs never match Dask's messages.

Tags are chosen by the receiver: each process numbers its incoming connections per peer, so a
(communicator, peer, tag) is unique at the receiver without any agreement between the two sides,
and a tag is never reused with that peer (stray messages of a closed connection cannot reach a
new one).

A construction is collective, so it waits for its peer; the connector starts its side before the
listener has committed to the pair (one round trip less), and a connection that dies in between
would leave it waiting forever. Such a build is cancelled (``cancel``): the connections waiting on
it fail, the activation gate and the pair token are let go, and its thread, which nothing can pull
out of the collective, is left there; should the peer call it after all, the communicator it
returns is kept for the pair as any other.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import threading
import time

from ..worker.activation import GATE
from . import stats
from .link import PoolLink, on_leave

NAME_PREFIX = "dask-pmix-comm"


class PairCancelled(ConnectionError):
    """A pair communicator's construction was given up on (its peer may never call it)."""


def peer_index(me: int, peer: int) -> int:
    """The peer's rank in the pair's communicator (ranks are included in pool-rank order)."""
    return 0 if peer <= me else 1


class PairRegistry:
    def __init__(self, link: PoolLink):
        self.link = link
        self.epoch_key = hashlib.sha1(link.epoch.encode()).hexdigest()[:10]
        self._lock = threading.Lock()
        self._pairs: dict[int, dict[str, concurrent.futures.Future]] = {}
        self._broken: set[int] = set()
        self._tags: dict[int, int] = {}
        self._seq = itertools.count()
        # Constructions running now: name -> (thread, pair token, done when the thread is out of MPI).
        self._running: dict[str, tuple[threading.Thread, int | None, concurrent.futures.Future]] = {}
        self._cancelled: set[str] = set()
        self.create_seconds: list[float] = []  # one entry per communicator built, for the benchmark

    def names(self, peer: int) -> list[str]:
        """Names of the communicators with peer that exist or are being built here, newest first."""
        with self._lock:
            pairs = self._pairs.get(peer, {})
            return [n for n, f in reversed(pairs.items()) if not (f.done() and f.exception() is not None)]

    def new_name(self, peer: int) -> str:
        lo, hi = sorted((self.link.rank, peer))
        return f"{NAME_PREFIX}:{self.epoch_key}:{lo}-{hi}:{self.link.rank}.{next(self._seq)}"

    def building_new(self, name: str, peer: int) -> bool:
        """Whether start(name, peer) would build a communicator here (none of that name exists or
        is being built)."""
        with self._lock:
            return name not in self._pairs.get(peer, {})

    def start(self, name: str, peer: int, reserved: int | None = None) -> concurrent.futures.Future:
        """The communicator called name with peer: built in a thread of its own (the collective
        blocks until the peer calls it too, and two processes may be building communicators with
        each other in opposite orders), or the one already built or being built."""
        with self._lock:
            pairs = self._pairs.setdefault(peer, {})
            fut = pairs.get(name)
            if fut is not None:
                GATE.pair_done(reserved)  # someone else builds it: this reservation is not needed
                return fut
            fut = pairs[name] = concurrent.futures.Future()
            thread = threading.Thread(
                target=self._build, args=(name, peer, fut, reserved), name=f"dask-pmix-pair-{peer}", daemon=True
            )
            self._running[name] = (thread, reserved, concurrent.futures.Future())
            thread.start()
        return fut

    def cancel(self, name: str, peer: int, why: str) -> bool:
        """Gives up on the construction of `name` under way here: the connections waiting on it
        fail with PairCancelled, the gate and its pair token are let go (see the module
        docstring). False if it is not under way (built, failed, or never started here)."""
        with self._lock:
            running = self._running.get(name)
            fut = self._pairs.get(peer, {}).get(name)
            if running is None or fut is None or fut.done() or name in self._cancelled:
                return False
            self._cancelled.add(name)
            thread, reserved, _ = running
            if thread.ident is not None:  # started (in start(), under this lock)
                GATE.abandon(thread.ident)  # under the lock: before the thread, once out, forgets it
        GATE.pair_done(reserved)
        stats.note("pair_comm_cancelled")
        fut.set_exception(PairCancelled(why))
        return True

    def cancel_wait(self, fut: concurrent.futures.Future, peer: int, why: str) -> bool:
        """cancel() for the construction whose connections wait on `fut`."""
        with self._lock:
            name = next((n for n, f in self._pairs.get(peer, {}).items() if f is fut), None)
        return name is not None and self.cancel(name, peer, why)

    def _build(self, name: str, peer: int, fut: concurrent.futures.Future, reserved: int | None) -> None:
        ranks = sorted({self.link.rank, peer})
        t0 = time.perf_counter()
        comm = error = None
        try:
            comm = self.link.create_comm(ranks, name)
            comm.Set_errhandler(self.link.MPI.ERRORS_RETURN)
        except BaseException as exc:
            error = exc
        finally:
            GATE.pair_done(reserved)
            with self._lock:
                _, _, out = self._running.pop(name)
                cancelled = name in self._cancelled
                self._cancelled.discard(name)
                if cancelled and error is None:
                    # The peer called it after all: the pair has this communicator.
                    fut = self._pairs.setdefault(peer, {})[name] = concurrent.futures.Future()
            GATE.forget(threading.get_ident())
            out.set_result(None)
        if error is not None:
            stats.note("pair_comm_failures")
            if not cancelled:
                fut.set_exception(error)
            return
        dt = time.perf_counter() - t0
        self.create_seconds.append(dt)
        stats.note("pair_comms")
        fut.set_result(comm)

    def alloc_tag(self, peer: int) -> int | None:
        """A receive tag for a new connection from peer; None when the tags are used up (a new
        pair communicator would be needed; the connection stays TCP)."""
        with self._lock:
            tag = self._tags.get(peer, 0) + 1
            if tag > 32767 and tag > self._tag_ub():
                return None
            self._tags[peer] = tag
            return tag

    def _tag_ub(self) -> int:
        MPI = self.link.MPI
        for pairs in self._pairs.values():
            for f in pairs.values():
                if f.done() and f.exception() is None:
                    return int(f.result().Get_attr(MPI.TAG_UB))
        return 32767

    def mark_broken(self, peer: int) -> None:
        """Building a communicator with peer failed: later connections with it stay TCP."""
        with self._lock:
            self._broken.add(peer)

    def broken(self, peer: int) -> bool:
        return peer in self._broken


_registries: dict[str, PairRegistry] = {}
_registries_lock = threading.Lock()


def registry_for(link: PoolLink) -> PairRegistry:
    with _registries_lock:
        reg = _registries.get(link.epoch)
        if reg is None or reg.link.rank != link.rank:
            reg = _registries[link.epoch] = PairRegistry(link)
        return reg


def drop_registries(wait: float = 1.0) -> int:
    """Forget every pair communicator (their session is going away): later connections stay TCP
    or build new ones in a new epoch. Freed only when built: a construction still blocked in the
    collective cannot be stopped; those still under way after ``wait`` seconds are counted and
    returned (the session must then not be finalized under them)."""
    with _registries_lock:
        regs = list(_registries.values())
        _registries.clear()
    futures = [fut for reg in regs for pairs in reg._pairs.values() for fut in pairs.values()]
    inside = []  # cancelled constructions whose threads are still inside MPI
    for reg in regs:
        with reg._lock:
            inside += [out for name, (_, _, out) in reg._running.items() if name in reg._cancelled]
    concurrent.futures.wait(futures + inside, timeout=wait)
    pending = sum(not out.done() for out in inside)
    for fut in futures:
        if not fut.done():
            pending += 1
        elif fut.exception() is None:
            try:
                fut.result().Free()
            except Exception:
                pass
    return pending


on_leave(drop_registries)
