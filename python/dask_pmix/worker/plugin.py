"""The worker side: a WorkerPlugin that hears the scheduler's pushes about this worker's jobs
(dask_pmix.worker.jobs) and puts the worker process into the in-process MPI pool.

At worker start (in the background, never on the event loop) it checks which MPI library the
worker's mpi4py loads: from the installed wheel, or else in a subprocess (loading it in the worker
would stop fork-mode ranks from starting cleanly if the pool cannot be used). For Open MPI it tells
the sidecar, through the scheduler, who the worker process is (its own host, pid, uid and gid) and
gets its pool rank and environment; then it initialises the one MPI session of the process's life
(dask_pmix.pool). When the worker closes, the session is finalized.

The scheduler plugin (SidecarPlugin) installs this plugin on every worker, those that join later
included; with ``SidecarPlugin(pool=False)`` the workers do not join the pool (``join=False``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from urllib.parse import urlparse

from distributed.comm.core import CommClosedError
from distributed.diagnostics.plugin import WorkerPlugin

from ..protocol import WORKER_PLUGIN, Scheduler, Stream
from . import jobs, members, pool
from . import mpi as worker_mpi
from .library import installed_library, pool_capable, pool_impl, probe_library

logger = logging.getLogger("dask_pmix")

# How long a worker asks again to join the pool while the sidecar is restarting.
JOIN_RETRY_FOR = 300.0

# The worker of this process that owns the process's one MPI session (workers may share a process).
_claim = threading.Lock()
_claimed_by: str | None = None


class PoolPlugin(WorkerPlugin):
    """Joins the worker process to the sidecar's in-process MPI pool (see the module docstring)."""

    name = WORKER_PLUGIN
    idempotent = True

    def __init__(self, session_timeout: float = 120.0, interfaces=None, join: bool = True):
        self.session_timeout = session_timeout
        self.interfaces = interfaces  # dask-pmix.pool.interfaces, as the scheduler has it
        self.join = join
        self._task: asyncio.Task | None = None
        self._out: str | None = None  # why this worker stays out of the pool (the sidecar was told)

    def setup(self, worker) -> None:
        worker.stream_handlers[Stream.JOB] = jobs.update
        worker.stream_handlers[Stream.SIDECAR_RESTARTED] = lambda namespaces=(), **_: self._sidecar_restarted(
            worker, set(namespaces)
        )
        # From now on the scheduler may push this worker's jobs to it (an operation a worker has
        # no handler for would close its stream).
        worker.batched_stream.send({"op": Stream.HELLO})
        self._task = asyncio.ensure_future(self._join(worker) if self.join else self._stay_out(worker))

    async def teardown(self, worker) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if not self.join:
            return
        if _claimed_by not in (None, worker.address):
            return  # the process's session is another worker's (see _join): it finalizes it
        from distributed.core import Status

        if worker.status == Status.closing:
            # Dask stops the heartbeat only after every plugin's teardown; finalizing MPI can take
            # seconds, and a heartbeat to a scheduler that closed meanwhile logs a traceback.
            for name in ("heartbeat", "keep-alive"):
                pc = worker.periodic_callbacks.get(name)
                if pc is not None:
                    pc.stop()
        finished = await asyncio.to_thread(pool.close, in_flight=members.in_flight())
        if not finished:
            logger.warning("dask-pmix: finalizing the MPI session did not finish in time")

    def _sidecar_restarted(self, worker, namespaces: set[str]) -> None:
        """A new sidecar took the place of one that died (`namespaces`: the pool namespaces it
        serves); it knows nothing of this worker's place in the pool. A session made with the old
        one cannot serve again (a PMIx client does not reconnect, and Open MPI cannot initialise
        twice), so such a worker leaves the pool and asks to be replaced by a fresh process, which
        joins the new sidecar's pool (its data is moved to other workers first). A worker that
        stayed out says so again; one without a session joins."""
        made_in = pool.namespace()
        if made_in is not None and made_in in namespaces:
            return
        if made_in is not None and _claimed_by == worker.address:
            reason = "its MPI session was made with a sidecar that has since restarted"
            self._task = asyncio.ensure_future(self._leave(worker, reason, replace=True))
        elif self._out is not None:
            self._task = asyncio.ensure_future(self._leave(worker, self._out))
        elif self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._join_pool(worker))

    async def _leave(self, worker, reason: str, replace: bool = False) -> None:
        """Tells the sidecar that this worker is out of the pool (so that no job waits for it), and
        why; with `replace`, asks for its replacement by a fresh process too."""
        self._out = reason
        try:
            await getattr(worker.scheduler, Scheduler.LEAVE_POOL)(worker=worker.address, reason=reason)
            if replace:
                await getattr(worker.scheduler, Scheduler.REPLACE_WORKER)(worker=worker.address, reason=reason)
        except Exception as e:  # noqa: BLE001 - the scheduler is closing
            logger.debug("dask-pmix: could not tell the scheduler: %r", e)

    async def _stay_out(self, worker) -> None:
        await self._leave(worker, "the cluster's workers do not join the pool (SidecarPlugin(pool=False))")

    async def _join(self, worker) -> None:
        global _claimed_by
        with _claim:
            other = _claimed_by
            if other is None:
                _claimed_by = worker.address
        if other is not None:
            # One MPI session per process: a second worker in this process (workers started in
            # one Python process) stays out of the pool.
            reason = f"worker {other} in the same process holds its MPI session"
            logger.info("dask-pmix: this worker stays out of the MPI pool: %s", reason)
            await self._leave(worker, reason)
            return
        await self._join_pool(worker)

    async def _join_pool(self, worker) -> None:
        try:
            reason = None
            impl = "openmpi"
            try:
                version = installed_library()
                if version is None:
                    version = await asyncio.to_thread(probe_library)
                impl = pool_impl(version)
                reason = pool_capable(version)
            except Exception as e:  # noqa: BLE001
                reason = str(e)
            if reason is not None:
                logger.info("dask-pmix: this worker stays out of the MPI pool: %s", reason)
                await self._leave(worker, reason)
                return
            if impl == "openmpi":
                try:
                    # Loaded before asking: the members of a cohort start their sessions together
                    # right after the answer, and each waits at most 2 s for the others' (a library
                    # still loading under load would fail them all). Not MPICH: its UCX reads the
                    # world's UCX_LOG_LEVEL when the library loads, which must come after the answer.
                    await asyncio.to_thread(worker_mpi.mpi_module)
                except Exception as e:  # noqa: BLE001 - the session's own start reports it
                    logger.debug("dask-pmix: mpi4py could not be loaded ahead: %r", e)
            loop = asyncio.get_running_loop()
            deadline, pause = loop.time() + JOIN_RETRY_FOR, 0.5
            while True:
                answer = await getattr(worker.scheduler, Scheduler.JOIN_POOL)(
                    worker=worker.address,
                    host=urlparse(worker.address).hostname or "",
                    pid=os.getpid(),
                    uid=os.getuid(),
                    gid=os.getgid(),
                    **({"impl": impl} if impl != "openmpi" else {}),
                )
                # The sidecar restarting (unreachable, or not taking joins yet): ask again, a while.
                if "error" not in answer or answer.get("status") not in (0, 503) or loop.time() + pause > deadline:
                    break
                await asyncio.sleep(pause)
                pause = min(2 * pause, 5.0)
            if "error" in answer:
                logger.warning("dask-pmix: this worker cannot join the MPI pool: %s", answer["error"])
                return
            pool.start(
                answer["pool"],
                answer["env"],
                address=urlparse(worker.address).hostname,
                interfaces=getattr(self, "interfaces", None),
                comm_secret=answer.get("commSecret") or None,
            )
            await asyncio.to_thread(pool.current, self.session_timeout)
            st = pool.status()
            if st["state"] != "ready":
                reason = (
                    st["reason"]
                    if st["state"] == "failed"
                    else f"the MPI session did not start within {self.session_timeout:.0f} s"
                )
                await self._leave(worker, f"its MPI session failed: {reason}")
                if len(answer["pool"].get("localPeers") or ()) > 1 and worker.nanny:
                    # A cohort member's session fails when a peer declared on its node never
                    # initialised (Open MPI waits 2 s for each). This process cannot initialise
                    # MPI again; a fresh one joins the pool alone, as any later worker does.
                    logger.warning(
                        "dask-pmix: this worker's MPI session failed in its cohort; restarting it to "
                        "join the pool alone: %s",
                        reason,
                    )
                    await getattr(worker.scheduler, Scheduler.REPLACE_WORKER)(
                        worker=worker.address, reason=f"its MPI session failed in its cohort: {reason}"
                    )
                else:
                    logger.warning("dask-pmix: this worker's MPI session failed; its jobs run in fork mode: %s", reason)
            else:
                if impl == "openmpi":
                    # Its cohort may be retired by Dask again (dask_pmix.scheduler.joining).
                    try:
                        await getattr(worker.scheduler, Scheduler.POOL_UP)(worker=worker.address)
                    except Exception as e:  # noqa: BLE001 - the hold ends by its own bound then
                        logger.debug("dask-pmix: could not tell the scheduler the session is up: %r", e)
                    logger.info(
                        "dask-pmix: this worker is rank %s of MPI pool %s",
                        answer["pool"]["rank"],
                        answer["pool"]["namespace"],
                    )
                else:
                    logger.info("dask-pmix: this worker is %s world %s", impl, answer["pool"]["namespace"])
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the worker goes on without the pool
            if worker.status.name not in ("init", "starting", "running", "paused") or isinstance(
                e, (CommClosedError, OSError)
            ):
                # The scheduler or this worker is closing: nothing to report.
                logger.debug("dask-pmix: joining the MPI pool stopped: %r", e)
            else:
                logger.exception("dask-pmix: joining the MPI pool failed")
