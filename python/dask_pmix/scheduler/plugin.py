"""The scheduler side: keeps the sidecar's worker pool in step with Dask, freezes job members,
and relays job requests from clients and workers to the sidecar (which usually listens on the
scheduler's loopback only)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import config
from ..errors import SidecarError
from ..protocol import ACTIVE_STATES, RANK_KEY, SCHEDULER_PLUGIN, WORKER_PLUGIN, Remote, Scheduler
from ..rest import SidecarClient
from . import dashboard
from .join_barrier import JoinBarrier
from .serve_args import sidecar_argv
from .sidecar import EmbeddedSidecar
from .stuck_members import StuckMembers

logger = logging.getLogger("dask_pmix")

# A sidecar that has not answered for this long is taken for gone, and its running jobs fail.
SIDECAR_GONE_AFTER = 1.5
# How often the plugin looks for a dead embedded sidecar, and waits before reopening the stream.
SUPERVISE_INTERVAL = 0.5
# How long a job request waits in the sidecar's admission line when its workers are busy.
ADMISSION_WAIT = 60.0
EVENTS_RECONNECT_DELAY = 0.5
# An in-process member waits at the plugin's join barrier at most this long before it asks the
# sidecar again: the barrier learns of a job that ended from the event stream, and of anything
# the stream missed at the next round.
JOIN_ROUND = 1.0
# A member of a job whose members this plugin knows waits this long for the others at the plugin
# before it tells the sidecar it is there: when all come within it (the usual case), the barrier
# is met here and the sidecar hears of no join (the communicator's group construct tells it every
# member is there); a member that waits longer is recorded by the sidecar, which then names the
# ones that never came if the job's wiring times out.
JOIN_QUIET = 0.25
# How many released jobs the plugin remembers (from the event stream) for release_job.
RELEASED_KEPT = 4096


class SidecarPlugin(SchedulerPlugin):
    """Connects a Dask scheduler to a dask-pmix sidecar.

    With no `url` (and no DASK_PMIX_URL), the plugin starts `dask-pmix serve` as a child of the
    scheduler on a free loopback port and stops it when the scheduler closes.
    """

    name = SCHEDULER_PLUGIN
    idempotent = True

    def __init__(self, url: str | None = None, token: str | None = None, *, sidecar_args: list[str] | None = None,
                 sidecar_log: str | None = None, pool: bool = True):
        # Read here (the client's settings) and again in start() (the scheduler's) when unset.
        self.url = url or config.get("sidecar.url")
        self.token = token or config.get("sidecar.token")
        # Install the worker plugin that puts each worker process into the in-process MPI pool.
        self.pool = pool
        self.sidecar_args = list(sidecar_args or [])
        self.sidecar_log = sidecar_log
        self.embedded: EmbeddedSidecar | None = None
        self.rest: SidecarClient | None = None
        self.scheduler = None
        self._frozen: dict[str, set[str]] = {}  # job id -> member worker ids
        self._owners: dict[str, str] = {}       # job id -> client id
        self._lock = threading.Lock()
        self._registrations: dict[str, asyncio.Future] = {}
        self._creating = 0  # job requests in flight: their members are not known yet
        self._stop = threading.Event()
        self._events_thread: threading.Thread | None = None
        self._closed = False
        self._unreachable_since: float | None = None
        self._dropping: set[str] = set()  # jobs being ended because a rank's task was dropped
        self._background: set[asyncio.Future] = set()
        # In-process members wait at the sidecar until all are there: one thread each while they
        # wait, apart from the default executor so that they never starve the other calls.
        self._waits: concurrent.futures.ThreadPoolExecutor | None = None
        self._supervisor: asyncio.Future | None = None
        self._state_dir: str | None = None
        self._barriers: dict[str, JoinBarrier] = {}  # in-process jobs whose members are joining
        # From the event stream: members each active job still holds, and jobs released lately.
        self._holding: dict[str, set[str]] = {}
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._release_waiters: dict[str, set[asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        # Members of failed in-process jobs still stuck later are restarted from here (see there).
        self._stuck: StuckMembers | None = None
        self._traffic: dashboard.TrafficReport | None = None

    # The plugin is pickled on its way to the scheduler: send the configuration only.
    _CONFIG = ("url", "token", "sidecar_args", "sidecar_log", "pool")

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in self._CONFIG}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**{k: state[k] for k in ("url", "token")}, sidecar_args=state["sidecar_args"],
                      sidecar_log=state["sidecar_log"], pool=state.get("pool", True))

    # -- life cycle -----------------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self._loop = asyncio.get_running_loop()
        self._stuck = StuckMembers(scheduler, self.restart_worker)
        self.url = self.url or config.get("sidecar.url")
        self.token = self.token or config.get("sidecar.token")
        if not self.url:
            # The sidecar this plugin starts is never open: without a configured token it gets a
            # fresh one (made here, on the scheduler, so it never travels in the pickled plugin).
            self.token = self.token or secrets.token_urlsafe(32)
            args = sidecar_argv(self.sidecar_args, scheduler.address)
            self._state_dir = tempfile.mkdtemp(prefix="dask-pmix-state-")
            self.embedded = EmbeddedSidecar(token=self.token, extra_args=args,
                                            log_path=self.sidecar_log or config.get("sidecar.log"),
                                            state_dir=self._state_dir)
            self.url = await asyncio.to_thread(self.embedded.start)
            self._supervisor = asyncio.ensure_future(self._supervise())
        self.rest = SidecarClient(self.url, self.token, timeout=config.seconds("timeouts.request") or 30.0)
        await asyncio.to_thread(self._check_sidecar)
        scheduler.handlers.update({
            Scheduler.INFO: self.info,
            Scheduler.CREATE_JOB: self.create_job,
            Scheduler.JOB: self.job,
            Scheduler.RELEASE_JOB: self.release_job,
            Scheduler.MEMBER_LOST: self.member_lost,
            Scheduler.JOIN_POOL: self.join_pool,
            Scheduler.LEAVE_POOL: self.leave_pool,
            Scheduler.JOIN_JOB: self.join_job,
            Scheduler.LEAVE_JOB: self.leave_job,
            Scheduler.RESTART_WORKER: self.restart_worker,
        })
        dashboard.install(scheduler)  # the dashboard page, /dask-pmix/
        if dashboard.enabled():  # the workers' comm counters, for the page's traffic view
            self._traffic = dashboard.TrafficReport(scheduler, self.rest.report_traffic)
            self._traffic.start()
        self._waits = concurrent.futures.ThreadPoolExecutor(max_workers=1024, thread_name_prefix="dask-pmix-wait")
        for address in list(scheduler.workers):
            self._register_soon(address)
        if self.pool:
            from distributed.protocol.pickle import dumps

            # Built on each worker from its own code: the scheduler needs none of it.
            plugin = Remote("dask_pmix.worker.plugin:PoolPlugin", interfaces=config.get("pool.interfaces"))
            await scheduler.register_worker_plugin(None, dumps(plugin), name=WORKER_PLUGIN, idempotent=True)
        self._events_thread = threading.Thread(target=self._follow_events, name="dask-pmix-events", daemon=True)
        self._events_thread.start()

    def _check_sidecar(self) -> None:
        """Fails the scheduler's start with what to do when the sidecar cannot serve it."""
        try:
            self.rest.health(timeout=10)
        except SidecarError as e:
            raise SidecarError(0, f"cannot reach the dask-pmix sidecar at {self.url} ({e.message}): start it "
                                  "(dask-pmix serve) or fix dask-pmix.sidecar.url, or leave that unset so that "
                                  "the plugin starts its own") from None
        if not self.rest.token_accepted():
            raise SidecarError(401, f"the dask-pmix sidecar at {self.url} refuses "
                                    f"{'this' if self.token else 'a missing'} token: set dask-pmix.sidecar.token "
                                    "(or DASK_DASK_PMIX__SIDECAR__TOKEN) to the token the sidecar was started with")

    async def close(self) -> None:
        # From here on membership changes are the scheduler's own shutdown: nothing to tell the
        # sidecar, which is about to stop (an embedded one) or keeps its own state (a shared one).
        self._closed = True
        self._stop.set()
        if self._stuck is not None:
            self._stuck.close()
        if self._traffic is not None:
            self._traffic.stop()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        if self._waits is not None:
            self._waits.shutdown(wait=False, cancel_futures=True)
        if self._supervisor is not None:
            self._supervisor.cancel()
            self._supervisor = None
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.stop)
            self.embedded = None
        if self._state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)
            self._state_dir = None

    async def _supervise(self) -> None:
        """Restarts an embedded sidecar that died (reaping it), and registers the live workers
        with the new one; its state directory gives it back the psets and the job history."""
        while not self._stop.is_set():
            await asyncio.sleep(SUPERVISE_INTERVAL)
            embedded = self.embedded
            if embedded is None or self._stop.is_set():
                return
            status = embedded.exited()
            if status is None:
                continue
            logger.warning("dask-pmix: the embedded sidecar exited with %s; restarting it", status)
            try:
                await asyncio.to_thread(embedded.restart)
            except SidecarError as e:
                logger.error("dask-pmix: could not restart the sidecar: %s", e)
                continue
            for address in list(self.scheduler.workers):
                self._register_soon(address)
            logger.warning("dask-pmix: the sidecar is back (restart %d); %d workers registered again",
                           embedded.restarts, len(self.scheduler.workers))

    # -- membership -----------------------------------------------------------------------------
    def add_worker(self, scheduler, worker: str) -> None:
        self._register_soon(worker)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str | None = None, **kwargs) -> None:
        # The sidecar fails any job this worker is in, which releases the other members.
        pending = self._registrations.pop(worker, None)
        if self._closed or self.rest is None:
            return

        async def remove() -> None:
            if pending is not None:
                await asyncio.wait([pending])
            try:
                await asyncio.to_thread(self.rest.remove_worker, worker)
            except SidecarError as e:
                if e.status != 404:
                    logger.warning("dask-pmix: could not remove worker %s: %s", worker, e)

        self._soon(remove())

    def _soon(self, coro) -> asyncio.Future:
        """A background call to the sidecar, awaited (with a bound) when the plugin closes."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def transition(self, key, start: str, finish: str, *args, **kwargs) -> None:
        """A rank's task dropped before it finished (its future cancelled, or released by every
        client that held it) ends its job and gives the members back: the other ranks would
        otherwise wait for it until the wiring or job timeout."""
        if finish not in ("released", "forgotten") or start in ("memory", "erred", "released", "forgotten"):
            return
        if str(kwargs.get("stimulus_id", "")).startswith(("handle-worker-cleanup", "remove-worker")):
            # Its worker is gone, not the task dropped: the sidecar fails the job itself, naming
            # the member (deleting the job now would lose who ended it).
            return
        match = RANK_KEY.match(key) if isinstance(key, str) else None
        if match is None or self._closed or self.rest is None:
            return
        job_id = match.group(1)
        with self._lock:
            if job_id not in self._frozen or job_id in self._dropping:
                return
            self._dropping.add(job_id)

        async def drop() -> None:
            try:
                await self.release_job(job_id=job_id)
            finally:
                self._dropping.discard(job_id)

        self._soon(drop())

    def remove_client(self, scheduler, client: str) -> None:
        with self._lock:
            owned = [job for job, owner in self._owners.items() if owner == client]
        for job_id in owned:
            self._soon(self.release_job(job_id=job_id))

    def valid_workers_downscaling(self, scheduler, workers: list) -> list:
        # While a job is being created the sidecar may already have frozen members we have not
        # heard of yet: retire nobody until the answer is in.
        if self._creating:
            return []
        frozen = self.frozen_workers()
        return [ws for ws in workers if ws.address not in frozen]

    def frozen_workers(self) -> set[str]:
        with self._lock:
            return set().union(*self._frozen.values()) if self._frozen else set()

    def _register_soon(self, address: str) -> None:
        if self._closed or self.rest is None:  # start() registers the workers there are
            return
        ws = self.scheduler.workers.get(address)
        if ws is None:
            return
        body = {
            "id": address,
            "address": address,
            "host": ws.host,
            "pid": int(ws.pid or 0),
            # The scheduler cannot see a worker's uid; PMIx checks the one the rank reports, so
            # workers are assumed to run as the scheduler's user.
            "uid": os.getuid(),
            "gid": os.getgid(),
            "resources": {k: float(v) for k, v in (ws.resources or {}).items()},
        }

        async def register() -> None:
            try:
                await asyncio.to_thread(self.rest.register_worker, body)
            except SidecarError as e:
                if e.status != 409:  # already known: a re-registration after a restart
                    logger.warning("dask-pmix: could not register worker %s: %s", address, e)

        self._registrations[address] = self._soon(register())

    async def _registered(self, addresses: list[str] | None = None) -> None:
        pending = [f for a, f in self._registrations.items() if addresses is None or a in addresses]
        if pending:
            await asyncio.wait(pending)

    # -- handlers (called by clients and workers through the scheduler) -------------------------
    async def info(self) -> dict:
        # The token goes to Dask clients of this scheduler: they may run code on the scheduler
        # anyway (run_on_scheduler), so they learn nothing they could not read from this object.
        return {"url": self.url, "token": self.token, "embedded": self.embedded is not None}

    async def create_job(self, workers: list[str] | None = None, n: int | None = None, pset: str | None = None,
                         impl: str = "openmpi", owner: str | None = None, timeout: float | None = None,
                         wiring_timeout: float | None = None, labels: dict | None = None,
                         placement: str | None = None, mode: str | None = None,
                         wait: float | None = ADMISSION_WAIT) -> dict:
        unusable = _membership_mistake(self.scheduler, workers, n)
        if unusable:
            return {"error": unusable, "status": 422}
        await self._registered(workers)
        request: dict[str, Any] = {"impl": impl}
        if mode:
            request["mode"] = mode
        if pset:
            request["pset"] = pset
        elif workers:
            request["members"] = list(workers)
        else:
            selector: dict[str, Any] = {"count": int(n or len(self.scheduler.workers))}
            if placement:
                selector["placement"] = placement
            request["selector"] = selector
        if owner:
            request["owner"] = owner
        if timeout:
            request["timeoutSeconds"] = float(timeout)
        if wiring_timeout:
            request["wiringTimeoutSeconds"] = float(wiring_timeout)
        if labels:
            request["labels"] = {str(k): str(v) for k, v in labels.items()}
        try:
            self._creating += 1
            try:
                job = await asyncio.to_thread(self.rest.create_job, request, wait)
                members = [m["workerId"] for m in job.get("members", [])]
                with self._lock:
                    self._frozen[job["id"]] = set(members)
                    if owner:
                        self._owners[job["id"]] = owner
            finally:
                self._creating -= 1
        except SidecarError as e:
            return {"error": str(e), "status": e.status}
        envs = {}
        try:
            # In-process members need no environment: they are in the pool already.
            for member in members if job.get("mode") == "fork" else []:
                envs[member] = (await asyncio.to_thread(self.rest.member_env, job["id"], member))["env"]
        except SidecarError as e:
            # Nobody will run this job: give its members back now, not after the wiring timeout.
            await self.release_job(job_id=job["id"])
            return {"error": str(e), "status": e.status}
        return {"job": job, "envs": envs}

    async def job(self, job_id: str) -> dict:
        try:
            job = await asyncio.to_thread(self.rest.job, job_id, timeout=SIDECAR_GONE_AFTER)
        except SidecarError as e:
            gone = self._sidecar_gone(e)
            if e.status == 404 or gone:
                self._forget(job_id)
                return {"id": job_id, "state": "failed", "error": gone or str(e)}
            return {"id": job_id, "state": "unknown", "error": str(e)}
        self._unreachable_since = None
        if job.get("state") not in ACTIVE_STATES:
            self._forget(job_id)
        return job

    def _sidecar_gone(self, error: SidecarError) -> str | None:
        """Why the sidecar counts as gone, if it does: its process exited (the embedded one), or it
        has not answered for SIDECAR_GONE_AFTER seconds. Its jobs then fail instead of running on
        blind: nobody serves their collectives or notices a lost member any more."""
        proc = self.embedded.proc if self.embedded is not None else None
        if proc is not None and proc.poll() is not None:
            return f"the dask-pmix sidecar exited (status {proc.returncode})"
        if error.status:
            return None
        now = time.monotonic()
        self._unreachable_since = self._unreachable_since or now
        if now - self._unreachable_since >= SIDECAR_GONE_AFTER:
            return f"the dask-pmix sidecar at {self.url} has not answered for {now - self._unreachable_since:.1f} s"
        return None

    async def release_job(self, job_id: str, grace: float = 5.0, settle: float = 0.0,
                          wait: float | None = None) -> dict | None:
        """Gives the members back. A job that ended stays in the sidecar's history and is released
        there once its ranks have gone (at once, normally); one still active (after `settle`
        seconds: a job whose every rank returned ends when their reports arrive), or one whose
        ranks linger past `grace`, is deleted: aborted, released and forgotten. With `wait`, the
        answer comes after at most that many seconds ({"id", "releasing": True} if the release is
        not done) and the release goes on here in the background."""
        if wait is not None:
            task = self._soon(self.release_job(job_id, grace, settle))
            try:
                return await asyncio.wait_for(asyncio.shield(task), wait)
            except asyncio.TimeoutError:
                return {"id": job_id, "releasing": True}
        job: dict | None = None
        if settle and await self._released_soon(job_id, settle):
            # Ended by itself and released: the event stream said so, the sidecar need not be asked.
            self._forget(job_id)
            return {"id": job_id, "released": True}
        try:
            deadline = time.monotonic() + grace
            settled = time.monotonic() + settle
            while True:
                job = await asyncio.to_thread(self.rest.job, job_id)
                if job.get("state") in ACTIVE_STATES:
                    if time.monotonic() < settled:  # its members' last words are on their way
                        await asyncio.sleep(0.005)
                        continue
                    break
                if job.get("releasedAt"):
                    self._forget(job_id)
                    return job
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            job = await asyncio.to_thread(self.rest.delete_job, job_id)
        except SidecarError as e:
            job = {"id": job_id, "error": str(e)}
        self._forget(job_id)
        return job

    async def member_lost(self, job_id: str, worker: str, reason: str) -> dict | None:
        """A worker reports that its rank's process is gone (it killed it, or it died)."""
        try:
            return await asyncio.to_thread(self.rest.member_lost, job_id, worker, reason)
        except SidecarError as e:
            return {"id": job_id, "error": str(e)}

    # -- the in-process pool (relayed for the workers; see worker.py and inprocess.py) ----------
    async def join_pool(self, worker: str, host: str = "", pid: int = 0, uid: int | None = None,
                        gid: int | None = None, impl: str | None = None) -> dict:
        """A worker process joins the pool, saying who it is (its own host, pid, uid, gid) and, for
        MPICH / Intel MPI, which library it runs (it then joins as a world of its own)."""
        await self._registered([worker])
        identity: dict[str, Any] = {"pid": int(pid)}
        if impl:
            identity["impl"] = impl
        if host:
            identity["host"] = host
        if uid is not None:
            identity["uid"] = int(uid)
        if gid is not None:
            identity["gid"] = int(gid)
        try:
            # Not the loop's default executor (a few threads): the workers that start together all
            # wait here at once while the sidecar gathers them into cohorts.
            return await self._in_waits(self.rest.join_pool, worker, identity)
        except SidecarError as e:
            return {"error": str(e), "status": e.status}

    async def _in_waits(self, fn: Callable[..., dict], *args: Any) -> dict:
        """fn(*args) on a thread of the waits pool. A worker asking while the scheduler closes (a
        restarted one joining the pool) is told so; the pool is shut down by then, and Dask would
        log the RuntimeError with its traceback."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._waits, fn, *args)
        except RuntimeError:
            if not self._closed:
                raise
            return {"error": "the scheduler is closing", "status": 503}

    async def leave_pool(self, worker: str, reason: str) -> dict:
        await self._registered([worker])
        try:
            return await asyncio.to_thread(self.rest.leave_pool, worker, reason)
        except SidecarError as e:
            return {"error": str(e), "status": e.status}

    async def join_job(self, job_id: str, worker: str, wait: float = 10.0, ports: dict | None = None) -> dict:
        """An in-process member is there; answers when every member is (ready), or after at most
        `wait` s (not ready: the member asks again). Members wait here, never in a request held
        open at the sidecar. The barrier is met here when every member of a job this plugin
        knows waits here at once; a member left waiting longer than JOIN_QUIET tells the sidecar,
        which records the join and says whether every member has joined there; either way the
        answer that all are there wakes them all.

        An MPICH / Intel MPI member (``ports`` given, maybe empty) brings the ports it accepts on
        and needs everyone's (merge_tree): it joins at the sidecar itself, which holds them."""
        if ports is not None:
            try:
                return await self._in_waits(self.rest.join_job, job_id, worker, float(wait), ports)
            except SidecarError as e:
                return {"error": e.message, "status": e.status}
        barrier = self._barriers.get(job_id)
        if barrier is not None and barrier.ready:
            return {"ready": True}
        if barrier is None:
            barrier = self._barriers[job_id] = JoinBarrier()
        with self._lock:
            members = self._frozen.get(job_id)
        loop = asyncio.get_running_loop()
        round_end = loop.time() + max(0.0, min(float(wait), JOIN_ROUND))
        waiter = loop.create_future()
        barrier.waiters.add(waiter)
        barrier.present[worker] = barrier.present.get(worker, 0) + 1
        try:
            if members and worker in members and members.issubset(barrier.present):
                barrier.wake(ready=True)
                return {"ready": True}
            if members and worker in members:
                await asyncio.wait([waiter], timeout=min(JOIN_QUIET, max(0.0, round_end - loop.time())))
                if waiter.done() and waiter.result():
                    return {"ready": True}
            try:
                answer = await asyncio.to_thread(self.rest.join_job, job_id, worker, 0.0)
            except SidecarError as e:
                barrier.wake()  # the others ask again and hear the same
                return {"error": e.message, "status": e.status}
            if answer.get("ready") or (waiter.done() and waiter.result()):
                barrier.wake(ready=True)
                return {"ready": True}
            if not waiter.done():
                await asyncio.wait([waiter], timeout=max(0.0, round_end - loop.time()))
            return {"ready": bool(waiter.done() and waiter.result())}
        finally:
            barrier.waiters.discard(waiter)
            barrier.present[worker] -= 1
            if not barrier.present[worker]:
                del barrier.present[worker]
            if not barrier.present and self._barriers.get(job_id) is barrier:
                del self._barriers[job_id]

    def _wake_joiners(self, job_id: str | None = None) -> None:
        """From the event thread: members waiting to join `job_id` (all, with None) ask the sidecar
        again (the job ended, or the stream may have missed that it did)."""
        if self._loop is None or self._loop.is_closed():
            return

        def wake() -> None:
            for jid, barrier in list(self._barriers.items()):
                if job_id is None or jid == job_id:
                    barrier.wake()
        try:
            self._loop.call_soon_threadsafe(wake)
        except RuntimeError:  # the loop closed meanwhile
            pass

    async def leave_job(self, job_id: str, worker: str, ok: bool, reason: str = "",
                        failed_ranks: list | None = None) -> dict:
        try:
            return await asyncio.to_thread(self.rest.leave_job, job_id, worker, bool(ok), reason, failed_ranks or [])
        except SidecarError as e:
            return {"error": str(e), "status": e.status}

    async def restart_worker(self, worker: str, reason: str) -> dict:
        """A worker whose in-process member is stuck after its job failed asks to be restarted
        through its nanny (a worker without one is closed)."""
        logger.warning("dask-pmix: restarting worker %s: %s", worker, reason)

        async def restart() -> None:
            # Out of the sidecar first, which releases its job: released while it still lived,
            # it was available, and a job created before it went got it and failed at once.
            try:
                await asyncio.to_thread(self.rest.remove_worker, worker)
            except SidecarError as e:
                if e.status != 404:
                    logger.warning("dask-pmix: could not remove worker %s before its restart: %s", worker, e)
            try:
                await self.scheduler.restart_workers([worker], timeout=60, wait_for_workers=False, on_error="return",
                                                     stimulus_id=f"dask-pmix-restart-{time.time()}")
            except Exception:  # noqa: BLE001
                logger.exception("dask-pmix: restarting worker %s failed", worker)
            if worker in self.scheduler.workers:  # not restarted after all: it serves again
                self._register_soon(worker)

        asyncio.ensure_future(restart())
        return {"restarting": worker}

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._frozen.pop(job_id, None)
            self._owners.pop(job_id, None)

    # -- the sidecar's event stream: jobs created by others freeze their members too ------------
    def _follow_events(self) -> None:
        """Keeps the frozen sets in step with the sidecar. A broken stream is reopened with the
        last event's id (Last-Event-ID), so the sidecar replays what was missed; when it cannot
        (its history moved on, or it is a restarted sidecar) it says `resync`, and the frozen
        sets are read afresh from its job list."""
        last_id: str | None = None
        while not self._stop.is_set():
            try:
                with self.rest.event_stream(last_id) as source:
                    if last_id is None:
                        self._resync()  # the stream is open: nothing after this listing is missed
                    for sse in source.iter_sse():
                        if self._stop.is_set():
                            return
                        if sse.event == "resync":
                            self._resync()
                            continue
                        if sse.event == "overflow":
                            break  # this reader fell behind: reopen from the last event
                        if sse.id:
                            last_id = sse.id
                        if sse.event == "jobStateChanged":
                            self._job_changed(sse.json().get("jobStateChanged") or {})
                        elif sse.event == "workerStateChanged":
                            self._worker_changed(sse.json().get("workerStateChanged") or {})
                        elif sse.event == "workerLeft":
                            self._worker_left(sse.json().get("workerLeft") or {})
            except SidecarError as e:
                if e.status == 400:
                    last_id = None  # an id this sidecar cannot place: start afresh
            except Exception:  # noqa: BLE001 - a bad event must not end the thread
                logger.exception("dask-pmix: the event stream failed")
            self._wake_joiners()  # the stream broke: what it would have said is asked for instead
            if self._stop.wait(EVENTS_RECONNECT_DELAY):
                return

    def _job_changed(self, changed: dict) -> None:
        job = changed.get("job") or {}
        job_id = changed.get("jobId") or job.get("id")
        if not job_id:
            return
        if changed.get("to") in ACTIVE_STATES:
            members = {m["workerId"] for m in job.get("members", [])}
            with self._lock:
                self._frozen[job_id] = members
                self._holding.setdefault(job_id, set(members))
        else:
            self._forget(job_id)
            self._wake_joiners(job_id)
            if job.get("mode") == "inprocess" and changed.get("to") in ("failed", "aborted"):
                self._check_stuck(job_id, [m["workerId"] for m in job.get("members", [])])

    def _check_stuck(self, job_id: str, workers: list[str]) -> None:
        """From the event thread: the failed in-process job's members are checked a little later."""
        if self._stuck is None or self._closed or self._loop is None or self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._stuck.job_ended, job_id, workers)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _resync(self) -> None:
        active = {j["id"]: {m["workerId"] for m in j.get("members", [])}
                  for j in self.rest.jobs() if j.get("state") in ACTIVE_STATES}
        with self._lock:
            self._frozen = active
            self._owners = {job: owner for job, owner in self._owners.items() if job in active}
            # Jobs ended meanwhile are released without this stream saying so: their release is
            # read from the sidecar again.
            self._holding = {job: set(members) for job, members in active.items()}
        self._wake_joiners()

    def _worker_changed(self, changed: dict) -> None:
        """A member given back by its job (the sidecar names the job): once the last member of a
        job is, the job is released, and whoever waits for that hears it without asking."""
        job_id, worker = changed.get("jobId"), changed.get("workerId")
        if changed.get("to") == "available" and job_id:
            self._members_back(worker, [job_id])

    def _worker_left(self, left: dict) -> None:
        """A worker gone from the sidecar is held by no job any more (its job, if any, failed)."""
        with self._lock:
            jobs = [job for job, members in self._holding.items() if left.get("workerId") in members]
        self._members_back(left.get("workerId"), jobs)

    def _members_back(self, worker: str | None, jobs: list[str]) -> None:
        released = []
        with self._lock:
            for job_id in jobs:
                holding = self._holding.get(job_id)
                if holding is None:
                    continue
                holding.discard(worker)
                if holding:
                    continue
                del self._holding[job_id]
                self._released[job_id] = None
                released.append(job_id)
            while len(self._released) > RELEASED_KEPT:
                self._released.popitem(last=False)
        if released and self._loop is not None and not self._loop.is_closed():
            try:
                for job_id in released:
                    self._loop.call_soon_threadsafe(self._wake_releases, job_id)
            except RuntimeError:
                pass

    def _wake_releases(self, job_id: str) -> None:
        for f in self._release_waiters.pop(job_id, ()):
            if not f.done():
                f.set_result(True)

    async def _released_soon(self, job_id: str, seconds: float) -> bool:
        """Whether the event stream shows the job released within `seconds` (False: it did not,
        or this stream never saw the job active, and only the sidecar can say)."""
        with self._lock:
            if job_id in self._released:
                return True
            if job_id not in self._holding:
                return False
        waiter = asyncio.get_running_loop().create_future()
        self._release_waiters.setdefault(job_id, set()).add(waiter)
        with self._lock:  # released between the look above and the waiter's registration
            if job_id in self._released:
                return True
        try:
            return await asyncio.wait_for(waiter, timeout=seconds)
        except asyncio.TimeoutError:
            return False
        finally:
            waiters = self._release_waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._release_waiters[job_id]


def _membership_mistake(scheduler, workers: list[str] | None, n: int | None) -> str | None:
    """What is wrong with the members asked for, said so that the caller knows what to do."""
    have = len(scheduler.workers)
    if n is not None and n > have:
        return (f"the job asks for {n} members but the cluster has {have} worker{'s' * (have != 1)}: ask for at most "
                f"{have}, or add workers first (cluster.scale(...), or start more `dask worker`s)")
    unknown = [w for w in workers or [] if w not in scheduler.workers]
    if unknown:
        return (f"{', '.join(unknown)} {'is not a worker' if len(unknown) == 1 else 'are not workers'} of this "
                "cluster: pass addresses from client.scheduler_info()['workers']")
    return None


def dask_setup(scheduler) -> None:
    """`dask scheduler --preload dask_pmix`: installs the plugin with its defaults."""
    scheduler.add_plugin(SidecarPlugin(), name=SidecarPlugin.name)
