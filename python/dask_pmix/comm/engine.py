"""The MPI progress engine: one thread per process posts, progresses and completes every MPI
operation of the comm backend.

Why one thread: MPI keeps messages on one (communicator, peer, tag) in the order they were posted
by one thread, so posting every send and receive from here keeps frames in order without a tag
per frame; and progress goes on while the worker's event loop is busy (deserialising, or held by
the GIL of a task), which a loop-driven poller cannot do. mpi4py releases the GIL inside MPI calls.

The event loop posts a message's sends itself, and the receives of a message of up to
INLINE_RECV_MAX bytes (testing them once, which completes them when the sender's data is there
already: Open MPI's shared-memory transport copies it within the call), when nothing of that
connection waits in the inbox and no communicator is being built in the process: each hand-off to
this thread costs a wake-up, which on a loaded host is the bulk of a 1 MiB transfer. Whatever is
not complete then is handed over here; larger receives are posted here (their copy must not hold
the event loop).

How it avoids spinning a core (dask/distributed#4142 review): with nothing posted it blocks on an
Event (no wake-ups at all). With operations in flight it tests them continuously for 2 ms after
the last post or completion (longer spinning took CPU from the workers' tasks on a busy host),
then sleeps between polls with a doubling backoff capped at 1 ms, and at 20 ms once nothing has
been posted for a minute (a send whose receiver went away). Completions alone do not say a
transfer is moving: a 512 MiB frame can take seconds without one, and a transport that moves
fragments only when polled (the TCP BTL) must keep being polled by both ends.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..worker.activation import GATE
from . import prefault

logger = logging.getLogger(__name__)

AHEAD_WAIT = 0.002  # how long a post waits for the helper that populates its chunk
INLINE_RECV_MAX = 4 << 20  # receives of a message up to this size may be posted and completed on the event loop

SPIN_SECONDS = 0.002  # poll without sleeping this long after the last post or completion
BACKOFF_MIN = 20e-6
BACKOFF_MAX = 1e-3
STALE_SECONDS = 60.0  # nothing posted for this long: what is left is probably orphaned, poll slowly
BACKOFF_STALE = 20e-3
DRAIN_PERIOD = 20e-3  # how often closed connections' tags are probed for stray messages


def _plain(exc: BaseException) -> ConnectionError:
    """The error without its traceback. Kept with the transfer, the traceback would tie this
    thread's frame (holding mpi4py requests, which hold exports of the frames' memoryviews) into a
    reference cycle; CPython's collector cannot clear an exported memoryview and the process
    crashes (seen: "memoryview has 1 exported buffer", then SIGSEGV)."""
    return ConnectionError(f"{type(exc).__name__}: {exc}")


class Transfer:
    """The MPI side of one message in one direction: its frames' buffers, moved as chunks of at
    most chunk_bytes on one (communicator, peer, tag), completed together."""

    __slots__ = (
        "send",
        "comm",
        "peer",
        "tag",
        "buffers",
        "on_done",
        "remaining",
        "error",
        "requests",
        "pending",
        "cancelled",
    )

    def __init__(
        self,
        send: bool,
        comm,
        peer: int,
        tag: int,
        buffers: list,
        on_done: Callable[[BaseException | None], None] | None,
    ):
        self.send = send
        self.comm = comm
        self.peer = peer
        self.tag = tag
        self.buffers = buffers  # kept alive here until MPI is done with them
        self.on_done = on_done
        self.remaining = 0
        self.error: BaseException | None = None
        self.requests: list = []
        # A receive's chunks not posted yet, each with the event its populating sets (the progress
        # thread posts them one by one as they are faulted in, testing those posted meanwhile)
        self.pending: collections.deque | None = None
        self.cancelled = False


class Engine:
    def __init__(self, MPI, chunk_bytes: int):
        self.MPI = MPI
        self.chunk_bytes = int(chunk_bytes)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._requests: list = []
        self._owners: list[Transfer] = []
        self._drains: list[list] = []  # [comm, peer, tag, deadline]
        self._next_drain = 0.0
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stop = False
        self._closed = False
        self.polls = 0  # test rounds, for the idle-cost tests
        # Transfers in the inbox not posted yet, per (communicator, peer, tag, direction): while one
        # waits, later ones of that connection go through the inbox too (MPI matches in posting order).
        self._queued: dict[tuple, int] = {}
        self._queued_lock = threading.Lock()
        self._ahead = prefault.Ahead()  # populates a large receive's chunks ahead of their posts
        self._posting: list[Transfer] = []  # receives with chunks still to post (this thread's)
        self._parked: dict[tuple, collections.deque] = {}  # transfers waiting for one of _posting
        self.posted_now = 0  # transfers posted by their caller, for the tests
        self.completed_now = 0  # ... and completed there

    @staticmethod
    def _key(t: Transfer) -> tuple:
        return (id(t.comm), t.peer, t.tag, t.send)

    # --- called from any thread ---------------------------------------------------------------
    def submit(self, transfer: Transfer) -> None:
        if self._closed:
            self._finish_closed(transfer)
            return
        self._ensure_started()
        key = self._key(transfer)
        with self._queued_lock:
            self._queued[key] = self._queued.get(key, 0) + 1
        self._inbox.put(("post", transfer))
        self._wake.set()

    def post_now(self, transfer: Transfer) -> bool:
        """Post the transfer from this thread (the event loop) and test it once; what is not
        complete is handed to the progress thread. False (nothing done) when the transfer must go
        through submit(): the engine is closed, an earlier transfer of its connection waits in the
        inbox, or a communicator is being built in this process."""
        if self._closed:
            return False
        with self._queued_lock:
            if self._queued.get(self._key(transfer)):
                return False
        with GATE.progress_now() as free:
            if not free:
                return False
            try:
                self._post_requests(transfer)
            except Exception as exc:  # an MPI error posting: fail the transfer (its posted chunks complete)
                transfer.error = _plain(exc)
            self._test_transfer(transfer)
        self.posted_now += 1
        if transfer.remaining == 0:
            self.completed_now += 1
            self._finish(transfer)
            return True
        self._ensure_started()
        self._inbox.put(("adopt", transfer))
        self._wake.set()
        return True

    def cancel(self, transfer: Transfer) -> None:
        """Ask MPI to cancel a posted receive (a send cannot be cancelled in MPI-4). Its buffers
        stay referenced until MPI reports the request done, cancelled or filled."""
        self._inbox.put(("cancel", transfer))
        self._wake.set()

    def drain(self, comm, peer: int, tag: int, seconds: float) -> None:
        """Receive and drop whatever still arrives on a closed connection's tag for a while, so
        that a sender whose message was never read does not wait for its receiver forever."""
        if self._closed:
            return
        self._ensure_started()
        self._inbox.put(("drain", [comm, peer, tag, time.monotonic() + seconds]))
        self._wake.set()

    def in_flight(self) -> int:
        return len(self._owners)

    def close(self, timeout: float = 5.0) -> bool:
        """Make no MPI call from now on (the session is about to be finalized): new transfers fail
        at once, those in flight are abandoned with their buffers. True if the thread ended."""
        self._closed = True
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _finish_closed(self, t: Transfer) -> None:
        t.error = ConnectionError("the MPI engine is closed (the process left its MPI pool)")
        self._finish(t)

    # --- the progress thread ------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="dask-pmix-mpi-progress", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        last_progress = last_post = time.monotonic()
        backoff = BACKOFF_MIN
        while not self._stop:
            # Never while a communicator is being built in this process (see activation.py).
            with GATE.progress():
                if self._stop:
                    break
                if self._take_inbox():
                    last_progress = last_post = time.monotonic()
                    backoff = BACKOFF_MIN
                if self._posting and self._post_more():
                    last_progress = last_post = time.monotonic()
                    backoff = BACKOFF_MIN
                if self._drains and time.monotonic() >= self._next_drain:
                    self._probe_drains()
                tested = self._test() if self._requests else False
            if self._requests or tested or self._posting:
                if tested:
                    last_progress = time.monotonic()
                    backoff = BACKOFF_MIN
                    continue
                now = time.monotonic()
                if now - last_progress < SPIN_SECONDS:
                    continue
                cap = BACKOFF_STALE if now - last_post > STALE_SECONDS else BACKOFF_MAX
                backoff = min(backoff * 2, cap)
                self._wake.wait(backoff)
            elif self._drains:
                self._wake.wait(DRAIN_PERIOD)
            else:
                self._wake.wait()
            self._wake.clear()

    def _take_inbox(self) -> bool:
        took = False
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return took
            took = True
            try:
                if kind == "post":
                    self._post(item)
                elif kind == "adopt":
                    self._adopt(item)
                elif kind == "cancel":
                    item.cancelled = True  # its chunks not posted yet never will be
                    for req in item.requests:
                        if req:
                            req.Cancel()
                else:
                    self._drains.append(item)
            except Exception as exc:  # an MPI error posting: fail that transfer, keep the engine
                if kind == "post":
                    self._fail(item, _plain(exc))
                else:
                    logger.warning("dask-pmix comm engine: %s failed: %s", kind, exc)

    def _post(self, t: Transfer) -> None:
        key = self._key(t)
        if t.cancelled:  # cancelled while parked: nothing of it was posted
            self._unqueue(key)
            t.error = t.error or ConnectionError("the transfer was cancelled")
            self._finish(t)
            return
        if any(self._key(p) == key for p in self._posting):
            # Its chunks would match the earlier transfer's that are not posted yet (one
            # communicator, peer and tag): it waits until that one has posted its last.
            self._parked.setdefault(key, collections.deque()).append(t)
            return
        try:
            self._post_requests(t, pipelined=True)
        except Exception as exc:  # an MPI error posting: fail that transfer (its posted chunks complete)
            t.error = t.error or _plain(exc)
            t.pending = None
        finally:
            if not t.pending:
                self._unqueue(key)
        if t.pending:
            # Later transfers of this connection are parked meanwhile (post_now refuses them: the
            # key stays queued), so chunks keep their posting order.
            self._posting.append(t)
        self._adopt(t)

    def _unqueue(self, key: tuple) -> None:
        with self._queued_lock:
            left = self._queued.get(key, 1) - 1
            if left > 0:
                self._queued[key] = left
            else:
                self._queued.pop(key, None)

    def _post_requests(self, t: Transfer, pipelined: bool = False) -> None:
        """Posts the transfer's chunks (any thread; the requests are the transfer's until adopted).
        A receive's fresh buffers are faulted in first, a chunk ahead of its post (prefault.py).
        pipelined (the progress thread): a receive of several chunks posts its first one only and
        leaves the others in t.pending, for _post_more to post as the helper faults them in: the
        copy of chunk k (inside MPI_Test: Open MPI's single-copy get) then runs beside the
        populating of chunk k+1, instead of every chunk being populated before the first copy."""
        MPI = self.MPI
        op = t.comm.Isend if t.send else t.comm.Irecv
        step = self.chunk_bytes
        chunks = [buf[start : start + step] for buf in t.buffers for start in range(0, buf.nbytes, step)]
        ready = [self._ahead.ask(c, self._wake) for c in chunks] if not t.send and len(chunks) > 1 else None
        if pipelined and ready is not None:
            t.pending = collections.deque(zip(chunks, ready))
            self._post_chunk(t, wait=True)
            return
        for i, chunk in enumerate(chunks):
            # The helper may be slow to get the CPU on a loaded host: then this thread populates
            # the chunk itself (populating pages already in is cheap).
            if not t.send and (ready is None or not ready[i].wait(AHEAD_WAIT)):
                prefault.populate(chunk)
            req = op([chunk, MPI.BYTE], t.peer, t.tag)
            t.requests.append(req)
            t.remaining += 1

    def _post_chunk(self, t: Transfer, wait: bool) -> bool:
        """Posts t's next pending receive chunk once the helper has populated it; with wait, after
        AHEAD_WAIT this thread populates it itself. True if one was posted (its request is t's,
        not adopted yet). Called only while t.pending holds a chunk."""
        pending = t.pending
        assert pending, "no chunk left to post"
        chunk, ready = pending[0]
        if not ready.is_set():
            if not wait:
                return False
            if not ready.wait(AHEAD_WAIT):
                prefault.populate(chunk)
        pending.popleft()
        req = t.comm.Irecv([chunk, self.MPI.BYTE], t.peer, t.tag)
        t.requests.append(req)
        t.remaining += 1
        return True

    def _post_more(self) -> bool:
        """Posts the pending chunks of pipelined receives that are ready, and the next one of a
        receive that has nothing in flight (waiting for it: there is nothing to copy meanwhile).
        True if anything was posted."""
        posted = False
        keep, unparked = [], []
        for t in self._posting:
            if t.cancelled or t.error is not None:
                if t.cancelled and t.error is None:  # its buffer was never filled
                    t.error = ConnectionError("the transfer was cancelled")
                t.pending = None
            else:
                try:
                    while t.pending and self._post_chunk(t, wait=t.remaining == 0):
                        self._requests.append(t.requests[-1])
                        self._owners.append(t)
                        posted = True
                except Exception as exc:  # an MPI error posting: the transfer fails with its posted chunks
                    t.error = t.error or _plain(exc)
                    t.pending = None
            if t.pending:
                keep.append(t)
                continue
            t.pending = None
            key = self._key(t)
            self._unqueue(key)
            if t.remaining == 0:
                self._finish(t)
            parked = self._parked.get(key)
            if parked:
                unparked.append(parked.popleft())
                if not parked:
                    del self._parked[key]
        self._posting = keep
        for t in unparked:  # in the order they came, each once the one before it has posted all
            self._post(t)
            posted = True
        return posted

    def _test_transfer(self, t: Transfer) -> None:
        """Tests the transfer's requests once (any thread that owns them)."""
        for req in t.requests:
            if not req:
                continue  # done already (mpi4py sets a completed request to MPI_REQUEST_NULL)
            try:
                done = req.Test()
            except self.MPI.Exception as exc:
                t.error = t.error or _plain(exc)
                done = True
            if done:
                t.remaining -= 1

    def _adopt(self, t: Transfer) -> None:
        """This thread progresses the transfer's requests not complete yet."""
        for req in t.requests:
            if req:
                self._requests.append(req)
                self._owners.append(t)
        if t.remaining == 0 and not t.pending:
            self._finish(t)

    def _test(self) -> bool:
        """Test each request on its own: mpi4py's Testsome raises on an MPI error before it
        copies the freed handles back into the Request objects, which would leave them dangling."""
        self.polls += 1
        MPI = self.MPI
        keep_r, keep_o = [], []
        progressed = False
        for req, owner in zip(self._requests, self._owners):
            try:
                done = req.Test()
            except MPI.Exception as exc:  # a peer that died (Open MPI ft), a transport that failed
                owner.error = owner.error or _plain(exc)
                done = True
            if done:
                progressed = True
                owner.remaining -= 1
                if owner.remaining == 0 and not owner.pending:
                    self._finish(owner)
            else:
                keep_r.append(req)
                keep_o.append(owner)
        if progressed:
            self._requests, self._owners = keep_r, keep_o
        return progressed

    def _fail(self, t: Transfer, exc: BaseException) -> None:
        t.error = exc
        if t.remaining == 0 and not t.pending:
            self._finish(t)
        # posted chunks complete or fail on their own; the transfer finishes with the last one

    def _finish(self, t: Transfer) -> None:
        on_done, t.on_done = t.on_done, None
        t.buffers = []
        t.requests = []
        if on_done is not None:
            try:
                on_done(t.error)
            except Exception:
                logger.exception("dask-pmix comm engine: completion callback failed")

    def _probe_drains(self) -> None:
        now = time.monotonic()
        self._next_drain = now + DRAIN_PERIOD
        keep = []
        for entry in self._drains:
            comm, peer, tag, deadline = entry
            try:
                status = self.MPI.Status()
                msg = comm.Improbe(peer, tag, status)
                while msg is not None:
                    buf = np.empty(status.Get_count(self.MPI.BYTE), dtype=np.uint8)
                    t = Transfer(False, comm, peer, tag, [buf.data], None)
                    req = msg.Irecv([buf, self.MPI.BYTE])
                    t.requests.append(req)
                    t.remaining = 1
                    self._requests.append(req)
                    self._owners.append(t)
                    msg = comm.Improbe(peer, tag, status)
            except self.MPI.Exception:
                continue
            if deadline > now:
                keep.append(entry)
        self._drains = keep


_engine: Engine | None = None
_engine_lock = threading.Lock()


def engine_for(MPI: Any, chunk_bytes: int) -> Engine:
    """The process's engine (one per process: MPI is initialised once per process)."""
    global _engine
    with _engine_lock:
        if _engine is None or _engine.MPI is not MPI or _engine._closed:
            _engine = Engine(MPI, chunk_bytes)
        return _engine


_retired: list = []  # closed engines: their abandoned requests' buffers must never be freed


def stop_engine() -> bool:
    """Close the process's engine (before its MPI session is finalized)."""
    global _engine
    with _engine_lock:
        engine, _engine = _engine, None
    if engine is None:
        return True
    _retired.append(engine)
    return engine.close()
