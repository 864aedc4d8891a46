"""One member of an in-process MPI job: the worker process itself, in a task thread.

The member waits at the sidecar until every member is there (so that none enters
MPI_Comm_create_from_group, which cannot be interrupted, while another may never come), builds the
job's communicator from its pool (dask_pmix.pool), runs ``fn(comm, ...)`` on the data the worker
holds, frees the communicator and tells the sidecar it is done.

Failures (measured with the Open MPI 5.0.11 wheel, fault tolerance on):
- A member that dies: the sidecar fails the job at once and tells the survivors which process
  failed; their MPI calls return MPI_ERR_PROC_FAILED (usually before the sidecar notices: they
  name the failed ranks, MPIX_Comm_get_failed, so that the dead member is blamed) and they go
  back to Dask work.
- A member whose function raises revokes the communicator (ULFM), so that the others, waiting for
  it in a collective, get MPI_ERR_REVOKED instead of hanging.
- When the job fails while the function still runs (a timeout, a DELETE, a failure elsewhere), the
  watcher revokes the communicator; a member still stuck some seconds later (in MPI, or in code
  that ignores MPI) has its worker restarted through its nanny: no worker stays frozen.
  Meanwhile the watcher keeps MPI progressing for it (see _progress_for), so that a peer whose
  first contact with a member hung in Python was under way is not left in its send. A member that
  holds the interpreter lock inside MPI stops the watcher too: the scheduler plugin restarts it
  from outside (dask_pmix.scheduler.stuck_members).
- Building the communicator has a deadline (dask-pmix.timeouts.communicator): a member whose
  MPI_Comm_create_from_group has not returned by then fails the job saying so, and its worker is
  restarted like any member stuck after its job failed.
- One job at a time in MPI per process: a member waits, before it joins, until the rank threads of
  earlier jobs in this process have left (their job has ended: the sidecar gives a worker to one job
  at a time; their communicator is revoked at once). Open MPI 5.0.x's ob1 queues a message for a
  communicator not yet added to the PML on an unlocked list that MPI_Comm_create_from_group scans
  only once; another thread progressing MPI meanwhile (a cancelled job's rank still in its Barrier)
  can append there after the scan, and the new communicator's activation then waits forever.
- A member that leaves a failed job keeps MPI progressing until the others have left too (at most
  LINGER s): a peer still sending to it would otherwise wait for good (see _linger).
- MPICH / Intel MPI (each worker a world of its own, pool.World): the communicator comes from a
  merge tree of connect/accept over ports the members bring to their join (dask_pmix.member.merge_tree).
  MPICH neither reports failed processes nor can revoke (MPIX_Comm_revoke asserts in ch4): a
  member left inside one of fn's MPI calls after the job failed is restarted as above. The
  members end the job with a barrier of their own that they poll, so a member leaves MPI only
  once every function has returned (MPI progresses only while its processes call it) and gives
  the barrier up when the job fails.
- A communicator that saw a failure is not freed (kept until the session ends): freeing it and
  reusing its slot while revoke messages are in flight crashed later jobs in ompi_comm_revoke_local.
  No revoke follows an MPI failure either: the failed process is known to all already, and the
  extra revoke traffic made survivors crash in the next job more often.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import MPIJobError
from ..protocol import FAILED_STATES
from ..worker import members as registry, pool as pool_mod
from ..worker.activation import GATE

logger = logging.getLogger("dask_pmix")


@dataclass
class SidecarCalls:
    """The sidecar, as a member sees it (through the scheduler); callable from a task thread."""
    join: Callable[..., dict]               # wait seconds[, ports] -> {"ready", "job"[, "ports"]} or {"error"}
    leave: Callable[[bool, str, list], Any]  # ok, reason, job ranks seen failed
    state: Callable[[], dict]               # the job: {"state", "error", ...}
    restart: Callable[[str], Any]           # reason: restart this worker through its nanny


@dataclass
class _Watch:
    job_id: str
    calls: SidecarCalls
    comm: Any = None
    failed_at: float | None = None
    revoked: bool = False
    restarted: bool = False
    since: float = field(default_factory=time.monotonic)
    # How long MPI_Comm_create_from_group may take (None: no bound); see Watcher._check.
    build_timeout: float | None = None
    # Held while the communicator is revoked or given up: never revoke one that is being freed.
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    # MPICH has no revoke (ULFM is Open MPI's here): its stuck members can only be restarted.
    revocable: bool = True


class Watcher:
    """One thread per worker process that looks after its running in-process members."""

    def __init__(self, poll: float = 0.2, grace: float = 3.0):
        self.poll = poll
        self.grace = grace
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}
        self._thread: threading.Thread | None = None

    def watch(self, job_id: str, calls: SidecarCalls, build_timeout: float | None = None,
              revocable: bool = True) -> _Watch:
        w = _Watch(job_id, calls, build_timeout=build_timeout, revocable=revocable)
        with self._lock:
            self._watches[job_id] = w
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="dask-pmix-job-watcher", daemon=True)
                self._thread.start()
        return w

    def unwatch(self, job_id: str) -> None:
        with self._lock:
            self._watches.pop(job_id, None)

    def busy(self) -> bool:
        """Whether a member of this process is still in its job (maybe inside MPI)."""
        with self._lock:
            return bool(self._watches)

    def _run(self) -> None:
        while True:
            time.sleep(self.poll)
            with self._lock:
                watches = list(self._watches.values())
            for w in watches:
                try:
                    self._check(w)
                except Exception:  # noqa: BLE001 - the watcher must outlive any one job
                    logger.exception("dask-pmix: watching job %s failed", w.job_id)

    def end_now(self, job_id: str, why: str) -> None:
        """The job has ended (this process is wanted by another one): revoke now, not at the next poll."""
        with self._lock:
            w = self._watches.get(job_id)
        if w is None:
            return
        if w.failed_at is None:
            w.failed_at = time.monotonic()
            logger.info("dask-pmix: job %s is over (%s) while its member runs", job_id, why)
        self._revoke(w)

    def _revoke(self, w: _Watch) -> None:
        with w.lock:
            if w.revocable and not w.revoked and not w.done and w.comm is not None:
                w.revoked = True
                revoke(w.comm)

    def _check(self, w: _Watch) -> None:
        now = time.monotonic()
        if now - w.since < self.poll:
            return
        if w.failed_at is None and w.comm is None and w.build_timeout is not None and now - w.since > w.build_timeout:
            # MPI_Comm_create_from_group cannot be interrupted: fail the job (every member's watcher
            # then restarts its stuck worker) instead of leaving run_mpi and the workers waiting.
            w.failed_at = now
            building = "MPI_Comm_create_from_group" if w.revocable else "the merge tree of connect/accept"
            reason = (f"building the job's communicator ({building}) did not finish within "
                      f"{w.build_timeout:g} s (dask-pmix.timeouts.communicator)")
            logger.warning("dask-pmix: job %s: %s", w.job_id, reason)
            try:
                w.calls.leave(False, reason, [])
            except Exception as exc:  # noqa: BLE001 - the restart below still ends the member
                logger.warning("dask-pmix: could not tell the sidecar: %r", exc)
        if w.failed_at is None:
            state = w.calls.state()
            if state.get("state") not in FAILED_STATES:
                return
            w.failed_at = now
            logger.info("dask-pmix: job %s %s while this member runs: %s", w.job_id, state.get("state"),
                        state.get("error"))
        self._revoke(w)
        if w.revocable and not w.done and not w.restarted:
            _progress_for(w)
        if not w.restarted and now - w.failed_at > self.grace:
            w.restarted = True
            building = "MPI_Comm_create_from_group" if w.revocable else "the merge tree of connect/accept"
            reason = (f"its member of job {w.job_id} was still running {self.grace:.0f} s after the job failed"
                      + (f" (inside {building})" if w.comm is None else ""))
            logger.warning("dask-pmix: restarting this worker: %s", reason)
            w.calls.restart(reason)


# How long the watcher keeps MPI progressing at each look at a failed job whose member still runs.
PROGRESS_BURST = 0.02


def _progress_for(w: _Watch) -> None:
    """Keeps MPI progressing, from the watcher, for a member still running after its job failed.

    Such a member may be one that calls no MPI (hung in Python): a peer whose first contact with
    this process was still under way then waits in its send for good (Open MPI's TCP transport
    finishes a connection only with both sides progressing; the revoke does not end that send),
    and had its worker restarted together with this one (seen in 3 of 4 hang loops). With this
    process progressing, the peer's send completes, the revoke ends its collective, and it goes
    back to Dask work; only this member is restarted."""
    if GATE.busy():  # never beside a communicator being built here (activation.py)
        return
    try:
        MPI = pool_mod.current().MPI
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
        logger.debug("dask-pmix: keeping MPI progressing for job %s failed: %r", w.job_id, exc)


_watcher = Watcher()

def _end_earlier(job_id: str):
    """Ends, for ``job_id``, a job still running in this process: it has ended (a worker is in one
    job at a time), so its communicator is revoked at once; its member then leaves with
    MPI_ERR_REVOKED, or its watcher restarts this worker."""
    return lambda other: _watcher.end_now(other, f"job {job_id} wants this worker")


def revoke(comm) -> None:
    """Revokes the communicator (ULFM): pending and later operations on it fail everywhere."""
    try:
        if not comm.Is_revoked():
            comm.Revoke()
    except Exception as exc:  # noqa: BLE001
        logger.debug("dask-pmix: revoking a communicator failed: %r", exc)


# Communicators that saw a failure, kept instead of freed (see the module docstring); bounded.
_kept: list = []
_KEEP = 256
# How long a member of a failed job keeps MPI progressing for the others (see _linger); below the
# watcher's grace, after which a member still running has its worker restarted.
LINGER = 1.0
# How long a job waits for the comm backend's pair communicators already agreed on (activation.py):
# their builds need only their peer's call, normally milliseconds.
PAIRS_WAIT = 10.0


def _give_up(comm, failed: bool) -> None:
    """Frees the communicator (or a merge_tree.Tree) of a job that went well; keeps one that saw
    a failure (bounded)."""
    if failed:
        _kept.append(comm)
        if len(_kept) > _KEEP:
            _free(_kept.pop(0))
        registry.left_behind(len(_kept))
        return
    _free(comm)


def _linger(rank: int, calls: SidecarCalls, bound: float) -> None:
    """Keeps MPI progressing, after this member left a failed job, until every other member has
    left it too (the sidecar says so) or ``bound`` seconds have passed.

    Open MPI's TCP transport needs the peer's progress to finish a connection (and a rendezvous):
    a member still sending to a peer that has gone back to Dask work, with nothing progressing
    MPI there, waits in mca_pml_ob1_send for good, the revoke notwithstanding (seen with a
    cancelled job's Barrier: that member's worker had to be restarted). Testing a generalized
    request, which never completes by itself, runs Open MPI's progress engine without any
    communicator or message of its own."""
    MPI = pool_mod.current().MPI
    req = MPI.Grequest.Start()
    try:
        deadline = time.monotonic() + bound
        next_look = 0.0
        while time.monotonic() < deadline:
            req.Test()
            if time.monotonic() >= next_look:
                members = calls.state().get("members") or []
                # A deleted job is forgotten: its members cannot be told apart, so wait out the bound.
                if members and all(m["state"] != "connected" for m in members if m["rank"] != rank):
                    return
                next_look = time.monotonic() + 0.05
            time.sleep(0.001)
        logger.debug("dask-pmix: stopped waiting after %.1f s for the other members to leave", bound)
    except Exception as exc:  # noqa: BLE001
        logger.debug("dask-pmix: keeping MPI progressing failed: %r", exc)
    finally:
        try:
            req.Complete()
            req.Wait()
        except Exception:  # noqa: BLE001
            pass


def _free(comm) -> None:
    try:
        comm.free() if hasattr(comm, "build") else comm.Free()
    except Exception as exc:  # noqa: BLE001 - a revoked or broken communicator may refuse
        logger.debug("dask-pmix: freeing a communicator failed: %r", exc)


def _failed_ranks(comm) -> list[int]:
    """The ranks of ``comm`` its MPI library knows to have failed (ULFM)."""
    try:
        MPI = pool_mod.current().MPI
        failed = comm.Get_failed()
        try:
            ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), comm.Get_group())
        finally:
            failed.Free()
        return [r for r in ranks if r is not None and r >= 0]
    except Exception:  # noqa: BLE001
        return []


def _is_mpi_error(exc: BaseException) -> bool:
    return hasattr(exc, "Get_error_class")


def _has_mpi_error(exc: BaseException) -> bool:
    """Whether an MPI exception is anywhere in ``exc``'s chain."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if _is_mpi_error(e):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def _describe(exc: BaseException) -> str:
    if hasattr(exc, "Get_error_string"):  # mpi4py's MPI.Exception: say which MPI error it is
        try:
            return f"MPI error: {exc.Get_error_string()}"
        except Exception:  # noqa: BLE001
            pass
    return f"{type(exc).__name__}: {exc}"


def run_member(*, job: dict, rank: int, worker: str, fn: Callable, args: tuple, kwargs: dict, calls: SidecarCalls,
               wiring_timeout: float, build_timeout: float | None = None) -> Any:
    """Runs ``fn(comm, *args, **kwargs)`` as ``rank`` of the in-process ``job`` in this thread.
    ``build_timeout``: how long building the communicator may take (None: no bound)."""
    job_id = job["id"]
    registry.enter(job_id)
    try:
        return _run_member(job, rank, worker, fn, args, kwargs, calls, wiring_timeout, build_timeout)
    finally:
        registry.leave(job_id)


def _run_member(job: dict, rank: int, worker: str, fn: Callable, args: tuple, kwargs: dict, calls: SidecarCalls,
                wiring_timeout: float, build_timeout: float | None) -> Any:
    job_id = job["id"]

    def fail(reason: str, cause: BaseException | None = None, failed: list | None = None) -> MPIJobError:
        try:
            calls.leave(False, reason, failed or [])
        except Exception:  # noqa: BLE001 - the sidecar fails the job anyway, later
            pass
        err = MPIJobError(reason, job_id=job_id, rank=rank, worker=worker, origin="rank")
        # The error travels to the client with its chain (Dask pickles causes and contexts): an
        # mpi4py exception there would load, and initialise, MPI in the client process. The
        # reason already says which MPI error it was.
        err.__cause__ = None if cause is None or _has_mpi_error(cause) else cause
        return err

    deadline = time.monotonic() + wiring_timeout
    p = pool_mod.current(wait=wiring_timeout)
    if p is None:
        raise fail(f"this worker is not in the MPI pool: {pool_mod.status()['reason']}")
    if job.get("impl", "openmpi") != "openmpi" or isinstance(p, pool_mod.World):
        return _run_world_member(job=job, rank=rank, fn=fn, args=args, kwargs=kwargs, calls=calls, world=p,
                                 deadline=deadline, fail=fail, build_timeout=build_timeout)
    if p.namespace != job["namespace"]:
        raise fail(f"this worker is in pool {p.namespace}, the job in {job['namespace']}")
    ranks = [m["poolRank"] for m in sorted(job["members"], key=lambda m: m["rank"])]

    # Before joining: the others wait at the sidecar (within the wiring timeout), none in MPI.
    lingering = registry.wait_alone(job_id, min(_watcher.grace + 5.0, max(0.0, deadline - time.monotonic())), _end_earlier(job_id))
    if lingering:
        raise fail(f"a rank of an earlier job ({', '.join(lingering)}) was still running in this worker "
                   f"{_watcher.grace + 5.0:.0f} s after that job ended (its worker is restarted); a new "
                   "communicator cannot be built while another thread is inside MPI")

    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise fail(f"the other members did not come within {wiring_timeout:.0f} s")
        answer = calls.join(min(10.0, left))
        if "error" in answer:
            raise MPIJobError(answer["error"], job_id=job_id, rank=rank, worker=worker)
        if answer.get("ready"):
            break

    w = _watcher.watch(job_id, calls, build_timeout)
    # No new pair communicator of the comm backend while this job builds and uses its own, and
    # none still being built when it starts (activation.py).
    if not GATE.job_begins(PAIRS_WAIT):
        logger.warning("dask-pmix: job %s: a pair communicator of the comm backend was still being built "
                       "after %.0f s; building the job's anyway", job_id, PAIRS_WAIT)
    try:
        # Errors are raised after their except blocks: raised inside, they would carry the
        # exception being handled as their context (see fail).
        error = None
        try:
            comm = p.comm(ranks, job["tag"])
        except Exception as exc:  # noqa: BLE001
            error = fail(f"building the job's communicator failed: {_describe(exc)}", exc)
        if error is not None:
            raise error
        w.comm = comm
        try:
            value = fn(comm, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001
            with w.lock:
                w.done = True
                mpi = _is_mpi_error(exc)
                failed = _failed_ranks(comm) if mpi else []
                if not mpi:
                    # The others may wait on this member in a collective: revoking ends that.
                    revoke(comm)
                _give_up(comm, failed=True)
            error = fail(_describe(exc), exc, failed)
        if error is not None:
            _linger(rank, calls, LINGER)
            raise error
        with w.lock:
            w.done = True
            _give_up(comm, failed=w.revoked)
    finally:
        GATE.job_ends()
        _watcher.unwatch(job_id)
    calls.leave(True, "", [])
    return value


# The ports of jobs whose merge tree failed stay open: a connector of such a job still under way
# must not reach a port of a later job that got the same tag (MPICH reuses a closed port's tag).
_stale_ports: list[dict] = []


def _run_world_member(*, job: dict, rank: int, fn: Callable, args: tuple, kwargs: dict, calls: SidecarCalls,
                      world, deadline: float, fail: Callable[..., MPIJobError],
                      build_timeout: float | None = None) -> Any:
    """An MPICH / Intel MPI member: the merge tree over the members' worlds, fn, a polled barrier."""
    from . import merge_tree

    job_id = job["id"]
    if not isinstance(world, pool_mod.World) or world.impl != job["impl"]:
        have = getattr(world, "impl", "openmpi")
        raise fail(f"this worker's in-process MPI is {have}, the job is for {job['impl']}")
    # A member of an earlier job still running here (a cancelled or failed job: MPICH has no revoke
    # to get it out of MPI) has its worker restarted by the watcher; this job cannot share it.
    lingering = registry.wait_alone(job_id, min(_watcher.grace + 5.0, max(0.0, deadline - time.monotonic())), _end_earlier(job_id))
    if lingering:
        raise fail(f"a rank of an earlier job ({', '.join(lingering)}) was still running in this worker "
                   f"{_watcher.grace + 5.0:.0f} s after that job ended (its worker is restarted: MPICH cannot "
                   "revoke its communicator)")
    MPI = world.MPI
    size = len(job["members"])
    ports = merge_tree.open_ports(MPI, rank, size)
    built = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise fail(f"the other members did not come within {job['wiringTimeoutSeconds']:.0f} s")
            answer = calls.join(min(10.0, left), ports)
            if "error" in answer:
                raise MPIJobError(answer["error"], job_id=job_id, rank=rank, worker=job["members"][rank]["workerId"])
            if answer.get("ready"):
                break
        peers = [m.get("ports") or {} for m in answer.get("ports") or []]
        if len(peers) != size:
            raise fail(f"the sidecar sent the ports of {len(peers)} members, not {size}")
        w = _watcher.watch(job_id, calls, build_timeout, revocable=False)
        tree = merge_tree.Tree(MPI, MPI.COMM_SELF)
        try:
            # Errors are raised after their except blocks: raised inside, they would carry the
            # (mpi4py) exception being handled as their context, and Dask pickles it to the client.
            error = None
            try:
                comm = tree.build(rank, size, peers, timeout=max(1.0, deadline - time.monotonic()))
                _check_tree(MPI, comm, rank, size, job_id)
            except Exception as exc:  # noqa: BLE001
                error = fail(f"building the job's communicator failed: {_describe(exc)}", exc)
            if error is not None:
                raise error
            built = True
            w.comm = comm
            raised: BaseException | None = None
            try:
                value = fn(comm, *args, **kwargs)
            except BaseException as exc:  # noqa: BLE001
                raised = exc
            if raised is not None:
                # The others may be done: a short barrier lets them leave MPI cleanly.
                _end_barrier(comm, w, limit=0.5)
                with w.lock:
                    w.done = True
                _give_up(tree, failed=True)
                raise fail(_describe(raised), raised)
            finished = _end_barrier(comm, w)
            with w.lock:
                w.done = True
            _give_up(tree, failed=not finished)
        finally:
            _watcher.unwatch(job_id)
    finally:
        if built or not ports:
            merge_tree.close_ports(MPI, ports)
        else:
            _stale_ports.append(ports)
            if len(_stale_ports) > _KEEP:
                merge_tree.close_ports(MPI, _stale_ports.pop(0))
    calls.leave(True, "", [])
    return value


def _check_tree(MPI, comm, rank: int, size: int, job_id: str) -> None:
    """Every member built the same communicator, in the job's rank order."""
    import zlib

    if comm.Get_size() != size or comm.Get_rank() != rank:
        raise RuntimeError(f"the merge tree gave rank {comm.Get_rank()} of {comm.Get_size()}, not {rank} of {size}")
    import array

    h = zlib.crc32(job_id.encode())
    out = array.array("q", [0, 0])
    comm.Allreduce(array.array("q", [h, -h]), out, op=MPI.MAX)
    if out[0] != h or -out[1] != h:
        raise RuntimeError("the merge tree joined members of another job")


def _end_barrier(comm, w: _Watch, limit: float | None = None) -> bool:
    """A barrier over the job, polled: True once every member reached it; False when the job
    failed meanwhile (or after ``limit`` seconds). Polling keeps MPI progressing here until
    every member is done: a member whose last send still sits in its MPI library must not stop
    calling MPI before its peer received it."""
    try:
        req = comm.Ibarrier()
    except Exception:  # noqa: BLE001
        return False
    t0 = time.monotonic()
    pause = 0.0
    while True:
        try:
            if req.Test():
                return True
        except Exception:  # noqa: BLE001
            return False
        if w.failed_at is not None or (limit is not None and time.monotonic() - t0 > limit):
            return False
        time.sleep(pause)
        pause = min(0.001, pause + 0.0001)
