"""One rank of a fork-mode MPI job: a child process of a Dask worker.

Fork mode is the isolated mode (and the fallback where in-process cannot serve, see
inprocess.py): each job runs in a child of the worker that sets the job's environment, joins
through MPI Sessions (or the world, for MPICH and Intel MPI), runs the function, sends the result
back over a pipe and exits. A failed or hung rank is contained: the child is killed and the worker
lives on. The child is forked from the worker (it inherits the worker's memory, the data already
there) when the worker has no MPI library loaded; a worker in the in-process pool has, and a fork
of it cannot start MPI again, so its rank is a fresh interpreter instead, given the function and
its arguments over a pipe.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from .. import pmi_connect
from ..errors import MPIJobError
from ..protocol import FAILED_STATES
from ..worker import jobs
from ..worker import mpi as worker_mpi

_HEADER = struct.Struct("!Q")
FAMILY = worker_mpi.FAMILY


# Kept here for the modules that import them from member.
mpi_module = worker_mpi.mpi_module


def library_name() -> str:
    return worker_mpi.library_name(mpi_module())


class _World:
    """MPI_Init/MPI_Finalize shaped like a session, for the libraries that join through the world."""

    def __init__(self, MPI):
        self.MPI = MPI
        MPI.Init_thread(MPI.THREAD_MULTIPLE)

    def Finalize(self):
        self.MPI.Finalize()


def connect(MPI):
    """The world model over the job's namespace, which holds exactly the job's ranks: MPI_Init
    makes MPI_COMM_WORLD the job, as under mpirun, for the job's function and for any library or C
    code it calls; the function gets a Dup of it. (A Session-only process of Open MPI 5.0.x cannot
    serve COMM_SELF, Reduce_local or Win_create, and MPICH's pickle-based collectives need
    COMM_SELF.) One rank per process and job, so the world is finalized when the rank ends."""
    world = _World(MPI)
    return world, MPI.COMM_WORLD.Dup()


def _send(fd: int, message: Any) -> None:
    try:
        payload = pickle.dumps(message, protocol=5)
    except Exception:
        import cloudpickle

        payload = cloudpickle.dumps(message, protocol=5)
    data = _HEADER.pack(len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _describe(exc: BaseException) -> dict:
    desc: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    # An mpi4py exception travels as its text: unpickling it would import mpi4py.MPI into the
    # worker, which initialises MPI there, and every later fork-mode rank of that worker refuses.
    if not type(exc).__module__.startswith("mpi4py"):
        try:
            pickle.dumps(exc)
            desc["exception"] = exc
        except Exception:
            pass
    return desc


def _leave(code: int) -> None:
    """Ends the rank's process without running the worker's Python shutdown (this is a fork of
    it). MPICH and Intel MPI send their PMI finalize from a C atexit hook, so for them the C
    exit() runs; os._exit would skip it and the sidecar would see the rank lost."""
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and "mpi4py.MPI" in sys.modules and library_name() != "openmpi":
        import ctypes

        ctypes.CDLL(None).exit(code)
    os._exit(code)


def _die_with_parent(parent: int | None = None) -> None:
    """The rank dies with the worker thread that started it (a worker killed outright must not
    leave a rank spinning next to peers that are gone)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    parent = os.getppid() if parent is None else parent
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


class _NoWorker:
    """What get_worker() gives inside a fork-mode rank: the Dask worker is another process, so
    any use of it raises an error that says so (get_client() and worker_client() use it too)."""

    def __init__(self, why: str):
        object.__setattr__(self, "_why", why)

    def __getattr__(self, name: str):
        raise RuntimeError(object.__getattribute__(self, "_why"))

    def __setattr__(self, name: str, value) -> None:
        raise RuntimeError(object.__getattribute__(self, "_why"))


def _without_worker_context(why: str) -> None:
    """Makes Dask's worker context inside this rank's process say why it is not there: set now if
    distributed is loaded (a forked rank inherits the task's context), else as soon as it is."""

    def install(module) -> None:
        module._worker_cvar.set(_NoWorker(why))

    if "distributed.worker" in sys.modules:
        install(sys.modules["distributed.worker"])
        return
    import importlib.abc
    import importlib.machinery

    class Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "distributed.worker":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_and_install(module):
                    exec_module(module)
                    install(module)

                spec.loader.exec_module = exec_and_install
            return spec

    sys.meta_path.insert(0, Hook())


def _child(fd: int, env: dict, impl: str, fn: Callable, args: tuple, kwargs: dict, why: str = "") -> None:
    code = 1
    try:
        _die_with_parent()
        _without_worker_context(
            "this MPI rank runs in a child process of its Dask worker (fork mode"
            + (f": {why}" if why else "")
            + "), so get_worker(), get_client() and worker_client() are not available in it; run the job in-process "
            "(mode='inprocess', Open MPI workers in the dask-pmix pool) to use the worker from the job's function"
        )
        os.environ.update(env)
        # Before any connection to the sidecar: a rank of the wrong MPI must report that, not be
        # seen as a member lost when its PMI connection closes.
        MPI = worker_mpi.load(impl)  # or an error that says what the worker's environment lacks
        # MPICH / Intel MPI: bind the PMI connection with the job's credential (no-op otherwise).
        pmi_connect.bind(os.environ)
        session, comm = connect(MPI)
        # The segments MPI just mapped, for the worker to remove should this process die
        # before it unlinks them (see _Segments).
        _send(fd, ("shm", sorted(_shm_segments(os.getpid()))))
        try:
            value = fn(comm, *args, **kwargs)
        except BaseException as exc:
            # Leave without finalizing: the sidecar sees the rank go and fails the job, which
            # releases the others instead of leaving them in a collective.
            _send(fd, ("error", _describe(exc)))
            os._exit(1)
        try:
            _send(fd, ("ok", value))
        except Exception as exc:  # unpicklable: said as run_mpi says it of an in-process rank's
            raise TypeError(
                f"a rank's result could not be sent back to the client ({type(exc).__name__}: {exc}); "
                "return a value that can be pickled"
            ) from exc
        if not MPI.Is_finalized():  # the function may have finalized MPI itself, as a script does
            comm.Free()
            session.Finalize()
        code = 0
    except BaseException as exc:
        try:
            _send(fd, ("error", _describe(exc)))
        except BaseException:
            pass
    finally:
        _leave(code)


class _Reader:
    """The messages of the rank's pipe: "shm" reports (the segments it mapped), then its result."""

    def __init__(self, on_shm: Callable[[list], None]):
        self.buf = bytearray()
        self.message: Any = None
        self.complete = False
        self.on_shm = on_shm

    def feed(self, data: bytes) -> None:
        self.buf += data
        while not self.complete and len(self.buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self.buf)
            if len(self.buf) < _HEADER.size + n:
                return
            message = pickle.loads(bytes(self.buf[_HEADER.size : _HEADER.size + n]))
            del self.buf[: _HEADER.size + n]
            if message[0] == "shm":
                self.on_shm(message[1])
            else:
                self.message = message
                self.complete = True


def _shm_segments(pid: int | str) -> set[str]:
    """The /dev/shm files a process has mapped (its MPI library's shared-memory segments)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {
                line.split(None, 5)[5].strip()
                for line in f
                if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/dev/shm/")
            }
    except OSError:
        return set()


class _Segments:
    """The /dev/shm segments of one rank's process, removed when it ends without finishing.

    An MPI library unlinks its shared-memory segments when its last local rank finalizes (MPICH's
    mpich_shm_<world>_<node>, named after the job, not the process); a rank killed or aborted
    before that leaves them behind for good. Their names are learnt while the rank lives: it
    reports what it mapped once MPI is up (before the job's function runs), and the worker looks
    at its maps again at each poll. The worker's own mappings (a forked rank inherits them) are
    never removed. The job's other ranks, the only other users, are failing with it; a mapping
    outlives the unlink anyway."""

    def __init__(self, pid: int):
        self.pid = pid
        self.paths: set[str] = set()

    def add(self, paths) -> None:
        self.paths.update(p for p in paths if isinstance(p, str) and p.startswith("/dev/shm/"))

    def look(self) -> None:
        self.add(_shm_segments(self.pid))

    def remove(self) -> list[str]:
        removed = []
        for path in sorted(self.paths - _shm_segments("self")):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        return removed


def _kill(pid: int, segments: _Segments) -> None:
    segments.look()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    segments.remove()


def _exit_description(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"the rank's process was killed by signal {signal.Signals(sig).name}"
    return f"the rank's process exited with status {os.WEXITSTATUS(status)} before returning a result"


def run_rank(
    *,
    job_id: str,
    rank: int,
    worker: str,
    env: dict,
    fn: Callable,
    args: tuple = (),
    impl: str = "openmpi",
    kwargs: dict | None = None,
    timeout: float | None = None,
    report_lost: Callable[[str], None] | None = None,
    finalize_grace: float = 30.0,
    mode_reason: str = "",
) -> Any:
    """Runs `fn(comm, *args, **kwargs)` as `rank` of `job_id` in a child process; returns its value.

    When the job fails (the scheduler pushes it: dask_pmix.worker.jobs) the child is killed and
    MPIJobError is raised, so no rank waits on a peer that is gone. `report_lost(reason)` tells
    the sidecar when the rank's process ended without finishing, so the members are released at
    once instead of when the sidecar notices. `mode_reason`: why the job runs in fork mode, said
    to a function that looks for its worker.
    """
    reported = False

    def report_once(reason: str) -> None:
        nonlocal reported
        if report_lost is None or reported:
            return
        reported = True
        try:
            report_lost(reason)
        except Exception:  # noqa: BLE001 - the sidecar notices the loss by itself, later
            pass

    try:
        return _run_rank(
            job_id, rank, worker, env, impl, fn, args, kwargs, timeout, finalize_grace, report_once, mode_reason
        )
    except MPIJobError as e:
        report_once(e.reason)
        raise


def _pool_loaded() -> bool:
    from ..worker import pool

    return pool.loaded()


def _spawn(fd: int, env: dict, impl: str, fn: Callable, args: tuple, kwargs: dict, why: str) -> int:
    """Starts the rank as a fresh interpreter (``python -m dask_pmix.member.fork``): the worker has an
    MPI library loaded (its pool session), which a forked child could not initialise again. The
    rank gets the worker's environment from before the pool's variables were set, the job's
    environment, the worker's sys.path, and the function and arguments over a pipe."""
    import threading

    import cloudpickle

    from ..worker import pool

    payload = pickle.dumps(list(sys.path)) + cloudpickle.dumps((env, impl, fn, args, kwargs, why), protocol=5)
    r, w = os.pipe()
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "dask_pmix.member.fork", "3", "4", str(os.getpid())],
            pool.environ_before(),
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, 3), (os.POSIX_SPAWN_DUP2, r, 4)],
        )
    finally:
        os.close(r)

    def feed() -> None:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view) :]
        except OSError:
            pass  # the rank died before reading everything: its exit is what the caller sees
        finally:
            os.close(w)

    threading.Thread(target=feed, name="dask-pmix-spawn-feed", daemon=True).start()
    return pid


def _spawned_main(fd: int, payload_fd: int, parent: int) -> None:
    """The spawned rank: reads what _spawn sends, then runs as a forked rank would."""
    _die_with_parent(parent)
    with os.fdopen(payload_fd, "rb") as f:
        sys.path[:] = pickle.load(f)
        env, impl, fn, args, kwargs, why = pickle.load(f)
    _child(fd, env, impl, fn, args, kwargs, why)


def _run_rank(job_id, rank, worker, env, impl, fn, args, kwargs, timeout, finalize_grace, report_lost, why):
    # The MPI library is loaded in the child only. Loaded in the worker, UCX (inside both MPICH's
    # and Open MPI's wheels) hooks dlopen/mmap behind a lock; a fork while another worker thread
    # holds it leaves the child deadlocked in MPI_Session_init (MPICH 5.0.2). A worker that has it
    # loaded (the pool's session) starts a fresh interpreter instead of forking.
    r, w = os.pipe()
    if _pool_loaded():
        pid = _spawn(w, env, impl, fn, args, kwargs or {}, why)
    else:
        pid = os.fork()
        if pid == 0:  # the rank
            os.close(r)
            _child(w, env, impl, fn, args, kwargs or {}, why)
    os.close(w)
    segments = _Segments(pid)
    reader = _Reader(segments.add)
    deadline = None if timeout is None else time.monotonic() + timeout
    finalize_deadline: float | None = None  # set once the result is in: the child finalizes
    exit_status: int | None = None
    # Readable when the child exits, and when the scheduler pushes a change of the job.
    exited_fd = os.pidfd_open(pid)
    job = jobs.Watch(job_id)
    watch = [r, exited_fd, job.fd]
    try:
        while True:
            now = time.monotonic()
            wake = [d for d in (deadline if not reader.complete else None, finalize_deadline) if d is not None]
            ready, _, _ = select.select(watch, [], [], max(0.0, min(wake) - now) if wake else None)
            if r in ready:
                data = os.read(r, 1 << 20)
                if data:
                    reader.feed(data)
                else:
                    watch.remove(r)  # end of file: only the exit is left to wait for
            if exited_fd in ready:
                _, status = os.waitpid(pid, 0)
                exit_status = status
                while r in watch and (data := os.read(r, 1 << 20)):  # what the child wrote before it exited
                    reader.feed(data)
                finished = reader.complete and reader.message[0] == "ok"
                if not (finished and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                    segments.remove()
                break
            now = time.monotonic()
            if reader.complete and finalize_deadline is None:
                finalize_deadline = now + finalize_grace
            if finalize_deadline is not None and now > finalize_deadline:
                _kill(pid, segments)  # the result is in; a finalize that hangs must not hold the worker
                break
            if deadline is not None and now > deadline and not reader.complete:
                # Its own deadline: the sidecar hears the timeout before the kill, whose closed
                # connection it would otherwise report first as the job's reason (a lost rank).
                err = MPIJobError(
                    f"timed out after {timeout:g} s", job_id=job_id, rank=rank, worker=worker, origin="rank"
                )
                report_lost(err.reason)
                _kill(pid, segments)
                raise err
            if job.fd in ready:
                state = job.drain() or {}
                if state.get("state") in FAILED_STATES:
                    _kill(pid, segments)
                    if not reader.complete:
                        raise MPIJobError(
                            state.get("error") or f"the job was {state.get('state')}",
                            job_id=job_id,
                            rank=rank,
                            worker=worker,
                        )
                    break
    finally:
        os.close(r)
        os.close(exited_fd)
        job.close()
    if reader.complete:
        kind, value = reader.message
        if kind == "ok":
            return value
        exc = value.get("exception")
        reason = f"{value['type']}: {value['message']}"
        raise MPIJobError(reason, job_id=job_id, rank=rank, worker=worker, origin="rank") from exc
    raise MPIJobError(_exit_description(exit_status or 0), job_id=job_id, rank=rank, worker=worker, origin="rank")


if __name__ == "__main__":
    _spawned_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
