"""The thread that looks after this process's running in-process members.

It sleeps until something happens: a change of a watched job, pushed by the scheduler
(dask_pmix.worker.jobs), or the next deadline of a watched member. Then:

- A member whose communicator is not built within its bound (MPI_Comm_create_from_group cannot be
  interrupted) fails its job, saying so.
- When a member's job fails while the member runs, its communicator is revoked (ULFM): the
  member's pending and later MPI calls on it fail, and it comes back by itself. Meanwhile MPI is
  kept progressing here in short bursts, so that a peer whose first contact with this process was
  under way finishes its send (Open MPI's TCP transport needs both sides' progress).
- A member still running GRACE s after its job failed has its worker replaced (its data moved to
  other workers first, then a restart through its nanny) only on evidence that it cannot come
  back: its thread is inside an MPI call (the communicator build, or a call on the job's
  communicator: dask_pmix.member.tracking), or inside the job's function past the job's own
  timeout. A member merely busy in Python is left alone: it is the user's task, as any other.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..worker import jobs
from ..worker.activation import GATE
from . import job_comms, tracking

logger = logging.getLogger("dask_pmix")

# How long after its job failed a member may still run before the evidence above is looked at.
GRACE = 3.0
# While a failed job's member still runs: how long each burst of MPI progress lasts, and how often.
PROGRESS_BURST = 0.02
PROGRESS_EVERY = 0.2


@dataclass
class Calls:
    """The scheduler, as a member sees it; callable from a task thread."""

    join: Callable[..., dict]  # wait seconds[, ports] -> {"ready", ...} or {"error"}
    leave: Callable[[bool, str, list], Any]  # ok, reason, job ranks seen failed
    replace: Callable[[str], Any]  # reason: replace this worker (data moved, then restarted)


@dataclass
class Watch:
    job_id: str
    calls: Calls
    thread_id: int
    revocable: bool = True  # MPICH has no revoke (ULFM is Open MPI's here)
    build_timeout: float | None = None
    job_timeout: float = 0.0
    phase: str = "build"  # build (our communicator's construction), fn (the job's function), done
    phase_since: float = field(default_factory=time.monotonic)
    comm: Any = None
    failed_at: float | None = None
    revoked: bool = False
    replaced: bool = False
    next_progress: float = 0.0
    left_alone_said: bool = False
    # Held while the communicator is revoked or given up: never revoke one that is being freed.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, phase: str, comm: Any = None) -> None:
        with self.lock:
            self.phase = phase
            self.phase_since = time.monotonic()
            if comm is not None:
                self.comm = comm
        jobs.poke()

    @property
    def done(self) -> bool:
        return self.phase == "done"


class Watcher:
    def __init__(self, grace: float = GRACE):
        self.grace = grace
        self._lock = threading.Lock()
        self._watches: dict[str, Watch] = {}
        self._thread: threading.Thread | None = None

    def watch(
        self,
        job_id: str,
        calls: Calls,
        *,
        build_timeout: float | None,
        job_timeout: float = 0.0,
        revocable: bool = True,
    ) -> Watch:
        w = Watch(
            job_id,
            calls,
            threading.get_ident(),
            revocable=revocable,
            build_timeout=build_timeout,
            job_timeout=job_timeout,
        )
        with self._lock:
            self._watches[job_id] = w
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dask-pmix-job-watcher", daemon=True)
                self._thread.start()
        jobs.poke()
        return w

    def unwatch(self, job_id: str) -> None:
        with self._lock:
            self._watches.pop(job_id, None)

    def end_now(self, job_id: str, why: str) -> None:
        """The job has ended (this process is wanted by another one): revoke now."""
        with self._lock:
            w = self._watches.get(job_id)
        if w is None:
            return
        if w.failed_at is None:
            w.failed_at = time.monotonic()
            logger.info("dask-pmix: job %s is over (%s) while its member runs", job_id, why)
        self._revoke(w)

    def _run(self) -> None:
        while True:
            seen = jobs.changes()  # before looking: a change while looking wakes the wait below
            with self._lock:
                watches = list(self._watches.values())
            wake = None
            for w in watches:
                try:
                    at = self._check(w)
                except Exception:  # noqa: BLE001 - the watcher must outlive any one job
                    logger.exception("dask-pmix: watching job %s failed", w.job_id)
                    at = time.monotonic() + 1.0
                if at is not None:
                    wake = at if wake is None else min(wake, at)
            timeout = None if wake is None else max(0.0, wake - time.monotonic())
            jobs.wait_change(seen, timeout)

    def _revoke(self, w: Watch) -> None:
        with w.lock:
            if w.revocable and not w.revoked and not w.done and w.comm is not None:
                w.revoked = True
                revoke(w.comm, w.job_id)

    def _check(self, w: Watch) -> float | None:
        """Acts on `w`; when it next needs looking at (None: only when something changes)."""
        now = time.monotonic()
        if (
            w.failed_at is None
            and w.phase == "build"
            and w.build_timeout is not None
            and now - w.phase_since > w.build_timeout
        ):
            w.failed_at = now
            building = "MPI_Comm_create_from_group" if w.revocable else "the merge tree of connect/accept"
            reason = (
                f"building the job's communicator ({building}) did not finish within "
                f"{w.build_timeout:g} s (dask-pmix.timeouts.communicator)"
            )
            logger.warning("dask-pmix: job %s: %s", w.job_id, reason)
            try:
                w.calls.leave(False, reason, [])
            except Exception as exc:  # noqa: BLE001
                logger.warning("dask-pmix: could not tell the scheduler: %r", exc)
        if w.failed_at is None:
            job = jobs.failed(w.job_id)
            if job is None:
                if w.phase == "build" and w.build_timeout is not None:
                    return w.phase_since + w.build_timeout + 0.01
                return None
            w.failed_at = now
            logger.info("dask-pmix: job %s %s while this member runs: %s", w.job_id, job.get("state"), job.get("error"))
        self._revoke(w)
        if w.done:
            return None
        if w.revocable and not w.replaced and now >= w.next_progress:
            progress_for(w.job_id)
            w.next_progress = time.monotonic() + PROGRESS_EVERY
        if not w.replaced and now - w.failed_at > self.grace:
            evidence = self._stuck(w, now)
            if evidence:
                w.replaced = True
                reason = (
                    f"its member of job {w.job_id} is stuck {evidence}, {now - w.failed_at:.0f} s after the job failed"
                )
                logger.warning("dask-pmix: replacing this worker: %s", reason)
                try:
                    w.calls.replace(reason)
                except Exception as exc:  # noqa: BLE001
                    logger.warning("dask-pmix: could not ask for this worker's replacement: %r", exc)
            elif not w.left_alone_said:
                w.left_alone_said = True
                logger.info(
                    "dask-pmix: the member of failed job %s still runs its function, outside MPI; it is left to finish",
                    w.job_id,
                )
        if w.replaced:
            return None
        nxt = w.failed_at + self.grace if now - w.failed_at <= self.grace else now + 1.0
        return min(nxt, w.next_progress) if w.revocable else nxt

    def _stuck(self, w: Watch, now: float) -> str | None:
        """Evidence that the member cannot come back by itself, or None."""
        if w.phase == "build":
            building = "MPI_Comm_create_from_group" if w.revocable else "the merge tree of connect/accept"
            return f"inside {building}"
        if w.phase != "fn":
            return None
        call = tracking.inside(w.thread_id)
        if call is not None:
            return f"inside MPI ({call[0]} for {now - call[1]:.0f} s)"
        if w.job_timeout and now - w.phase_since > w.job_timeout + self.grace:
            return f"inside the job's function past the job's timeout ({w.job_timeout:g} s)"
        return None


def revoke(comm, job_id: str | None = None) -> None:
    """Revokes the communicator (ULFM), and with ``job_id`` every other communicator of that job
    in this process (job_comms): pending and later operations on them fail here."""
    if job_id is not None and job_comms.revoke_all(job_id):
        return
    try:
        if not comm.Is_revoked():
            comm.Revoke()
    except Exception as exc:  # noqa: BLE001
        logger.debug("dask-pmix: revoking a communicator failed: %r", exc)


def progress_for(job_id: str) -> None:
    """One short burst of MPI progress, never beside a communicator being built here
    (activation.py). Testing a generalized request, which never completes by itself, runs Open
    MPI's progress engine without any communicator or message of its own."""
    from ..worker import pool

    if GATE.busy():
        return
    p = pool.current()
    if p is None:
        return
    try:
        MPI = p.MPI
        with GATE.progress():
            req = MPI.Grequest.Start()
            try:
                end = time.monotonic() + PROGRESS_BURST
                while time.monotonic() < end:
                    req.Test()
                    time.sleep(0.001)
            finally:
                req.Complete()
                req.Wait()
    except Exception as exc:  # noqa: BLE001
        logger.debug("dask-pmix: keeping MPI progressing for job %s failed: %r", job_id, exc)


WATCHER = Watcher()
