"""The scheduler side: keeps the sidecar's worker pool in step with Dask, freezes job members, and
relays job requests from clients and workers to the sidecar (which usually listens on the
scheduler's loopback only).

State is pushed: the sidecar's event stream is read here only (dask_pmix.scheduler.events), and
each change of a job goes on to its members' workers over Dask's scheduler-to-worker stream
(Stream.JOB) and to the client that owns it as a Dask event (Topic.JOB). Every call to the
sidecar is awaited on the event loop (dask_pmix.rest.AsyncSidecarClient): a job request waiting
in the sidecar's admission line holds no thread, so any number of them queue instead of
deadlocking. A job fails on evidence only: what the sidecar reports (a member's connection lost,
a rank's error, the job's timeout, a cancel), the sidecar's process exiting, or the sidecar
unreachable or silent for longer than `dask-pmix.timeouts.sidecar-gone`."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .. import config
from ..errors import MPIJobError, SidecarError
from ..protocol import (
    MEMBER_CONNECTED,
    QUEUED_ANNOTATION,
    RANK_KEY,
    SCHEDULER_PLUGIN,
    WORKER_PLUGIN,
    Remote,
    Scheduler,
    Stream,
    Topic,
)
from ..rest import AsyncSidecarClient
from . import dashboard, queued, stranded
from .comm_cache import CommCache, named_dead
from .elastic import Elastic
from .events import EventStream
from .jobs import ENDED_KEPT, Entry, JobMirror
from .join_barrier import JoinBarriers
from .joining import CohortJoining
from .replace import Replacer
from .returning import Returning, comes_back
from .serve_args import sidecar_argv
from .sidecar import EmbeddedSidecar

logger = logging.getLogger("dask_pmix")

# A fork job whose every rank's task finished is ended by its ranks' finalize; one still active this
# long after the last rank finished is ended here.
SETTLE = 2.0
# The stimuli of Scheduler.restart (client.restart()): it releases every task, the ranks' too.
RESTART_STIMULI = ("client-restart-", "restart-")
# An in-process job whose members duplicate a kept communicator (scheduler.comm_cache) is told to
# the sidecar as running once it has run this long (the sidecar sees no group construct for it).
REUSED_AFTER = 0.2


class SidecarPlugin(SchedulerPlugin):
    """Connects a Dask scheduler to a dask-pmix sidecar.

    With no `url` (and no DASK_PMIX_URL), the plugin starts `dask-pmix serve` as a child of the
    scheduler on a free loopback port, restarts it if it dies and stops it when the scheduler
    closes. With ``pool=False`` the workers do not join the in-process MPI pool (every job runs
    in fork mode).
    """

    name = SCHEDULER_PLUGIN
    idempotent = True

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        sidecar_args: list[str] | None = None,
        sidecar_log: str | None = None,
        pool: bool = True,
    ):
        # Read here (the client's settings) and again in start() (the scheduler's) when unset.
        self.url = url or config.get("sidecar.url")
        self.token = token or config.get("sidecar.token")
        self.pool = pool
        self.sidecar_args = list(sidecar_args or [])
        self.sidecar_log = sidecar_log
        self.embedded: EmbeddedSidecar | None = None
        self.rest: AsyncSidecarClient | None = None  # set by start()
        self.scheduler: Any = None
        self.jobs = JobMirror()
        self.stream: EventStream | None = None
        self.barriers = JoinBarriers(lambda: self.sidecar, self._members_of)
        self.comm_cache = CommCache()  # its bound is pool.comm-cache, read in start()
        self._reused_at: dict[str, asyncio.TimerHandle] = {}  # jobs on a kept communicator, until told running
        self.replacer: Replacer | None = None
        self.elastic: Elastic | None = None  # made in start()
        self._listening: set[str] = set()  # workers whose plugin handles Stream.JOB
        self._registrations: dict[str, asyncio.Future] = {}
        self._removals: dict[str, asyncio.Future] = {}  # workers the sidecar is being told are gone
        self._gone_waiters: set[asyncio.Event] = set()  # set at each worker removal (workers_gone)
        self._known: dict[str, tuple[str, bool]] = {}  # worker -> (its host, whether it has a nanny)
        self.returning = Returning()  # workers that left and are expected back (scheduler.returning)
        self._waiting: list[dict] = []  # job requests in the sidecar's admission line
        # Jobs whose rank tasks came before their admission (submit_mpi), by ticket, in the order
        # they came; the last one's request (its place in the sidecar's line), and what became
        # of admitted tickets (their rank keys name the ticket, not the job id).
        self._queued: dict[str, queued.Queued] = {}
        self._last_in_line: asyncio.Future | None = None
        self._admitted: collections.OrderedDict[str, str] = collections.OrderedDict()
        # Rank tasks whose result was lost with their worker after they returned (transition()).
        self._results_lost: set[str] = set()
        self._psets: dict[str, list[str]] = {}  # the sidecar's process sets: name -> members
        self.joining = CohortJoining()  # its bound is timeouts.pool-join, read in start()
        self._settling: dict[str, asyncio.TimerHandle | None] = {}  # jobs whose every rank returned
        self._background: set[asyncio.Future] = set()
        self._closed = False
        self._state_dir: str | None = None
        self._traffic: dashboard.TrafficReport | None = None
        self._stalled: asyncio.TimerHandle | None = None
        self._killed_why: str | None = None  # why this plugin killed the sidecar that exits next
        self._sidecar_started: float | None = None  # when the sidecar the stream follows started
        self._restarting: asyncio.Future | None = None  # done once the embedded sidecar is back

    @property
    def sidecar(self) -> AsyncSidecarClient:
        """The sidecar's REST client (once the plugin has started)."""
        if self.rest is None:
            raise SidecarError(0, "the dask-pmix plugin has not started")
        return self.rest

    # The plugin is pickled on its way to the scheduler: send the configuration only.
    _CONFIG = ("url", "token", "sidecar_args", "sidecar_log", "pool")

    def __getstate__(self) -> dict:
        return {k: self.__dict__[k] for k in self._CONFIG}

    def __setstate__(self, state: dict) -> None:
        SidecarPlugin.__init__(
            self,
            **{k: state[k] for k in ("url", "token")},
            sidecar_args=state["sidecar_args"],
            sidecar_log=state["sidecar_log"],
            pool=state.get("pool", True),
        )

    # -- life cycle -------------------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        self.url = self.url or config.get("sidecar.url")
        self.token = self.token or config.get("sidecar.token")
        if not self.url:
            # The sidecar this plugin starts is never open: without a configured token it gets a
            # fresh one (made here, on the scheduler, so it never travels in the pickled plugin).
            self.token = self.token or secrets.token_urlsafe(32)
            self._state_dir = tempfile.mkdtemp(prefix="dask-pmix-state-")
            self.embedded = EmbeddedSidecar(
                token=self.token,
                extra_args=sidecar_argv(self.sidecar_args, scheduler.address),
                log_path=self.sidecar_log or config.get("sidecar.log"),
                state_dir=self._state_dir,
            )
            self.url = await self.embedded.start()
            self.embedded.on_exit(self._sidecar_exited)
        self.rest = AsyncSidecarClient(self.url, self.token, timeout=config.seconds("timeouts.request") or 30.0)
        self.joining.bound = config.seconds("timeouts.pool-join") or self.joining.bound
        self.comm_cache.bound = max(0, int(config.get("pool.comm-cache", 16)))
        await self._check_sidecar()
        self.elastic = Elastic(
            scheduler,
            self.jobs.active,
            self.frozen_workers,
            lambda: self.sidecar.workers(),
            config.seconds("timeouts.drain") or 30.0,
            rest=lambda: self.rest,
        )
        self.elastic.install()
        self.replacer = Replacer(scheduler, lambda: self.rest, self._register_soon)
        for address in scheduler.workers:
            self.replacer.added(address)
        scheduler.handlers.update(
            {
                Scheduler.INFO: self.info,
                Scheduler.CREATE_JOB: self.create_job,
                Scheduler.JOB: self.job,
                Scheduler.RELEASE_JOB: self.release_job,
                Scheduler.MEMBER_LOST: self.member_lost,
                Scheduler.JOIN_POOL: self.join_pool,
                Scheduler.LEAVE_POOL: self.leave_pool,
                Scheduler.POOL_UP: self.pool_up,
                Scheduler.JOIN_JOB: self.join_job,
                Scheduler.LEAVE_JOB: self.leave_job,
                Scheduler.REPLACE_WORKER: self.replace_worker,
                Scheduler.PSET: self.pset,
                Scheduler.WORKERS_GONE: self.workers_gone,
                Scheduler.ELASTIC_CHANGE: self.elastic.change,
            }
        )
        scheduler.stream_handlers[Stream.HELLO] = self._hello
        dashboard.install(scheduler)  # the dashboard page, /dask-pmix/
        if dashboard.enabled():  # the workers' comm counters, for the page's traffic view
            self._traffic = dashboard.TrafficReport(scheduler, self.sidecar.report_traffic)
            self._traffic.start()
        self.stream = EventStream(
            self.rest,
            gone_after=config.seconds("timeouts.sidecar-gone") or 10.0,
            on_event=self._event,
            on_resync=self._resync,
            on_gone=self._sidecar_gone,
            on_back=lambda: None,
        )
        self.stream.start()
        for address in list(scheduler.workers):
            self._register_soon(address)
        from distributed.protocol.pickle import dumps

        # Built on each worker from its own code: the scheduler needs none of it.
        plugin = Remote("dask_pmix.worker.plugin:PoolPlugin", interfaces=config.get("pool.interfaces"), join=self.pool)
        await scheduler.register_worker_plugin(None, dumps(plugin), name=WORKER_PLUGIN, idempotent=True)

    async def _check_sidecar(self) -> None:
        """Fails the scheduler's start with what to do when the sidecar cannot serve it."""
        try:
            await self.sidecar.health(timeout=10)
        except SidecarError as e:
            raise SidecarError(
                0,
                f"cannot reach the dask-pmix sidecar at {self.url} ({e.message}): start it "
                "(dask-pmix serve) or fix dask-pmix.sidecar.url, or leave that unset so that "
                "the plugin starts its own",
            ) from None
        if not await self.sidecar.token_accepted():
            raise SidecarError(
                401,
                f"the dask-pmix sidecar at {self.url} refuses "
                f"{'this' if self.token else 'a missing'} token: set dask-pmix.sidecar.token "
                "(or DASK_DASK_PMIX__SIDECAR__TOKEN) to the token the sidecar was started with",
            )

    async def close(self) -> None:
        # From here on membership changes are the scheduler's own shutdown: nothing to tell the
        # sidecar, which is about to stop (an embedded one) or keeps its own state (a shared one).
        self._closed = True
        for timer in [*self._settling.values(), *self._reused_at.values()]:
            if timer is not None:
                timer.cancel()
        if self._stalled is not None:
            self._stalled.cancel()
        if self._traffic is not None:
            self._traffic.stop()
        if self.stream is not None:
            await self.stream.stop()
        if self.replacer is not None:
            await self.replacer.close()
        for q in self._queued.values():
            if q.task is not None:
                q.task.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=5)
        if self.embedded is not None:
            await self.embedded.stop()
            self.embedded = None
        if self.rest is not None:
            await self.rest.aclose()
        if self._state_dir:
            shutil.rmtree(self._state_dir, ignore_errors=True)
            self._state_dir = None

    def _sidecar_exited(self, status: int) -> None:
        """The embedded sidecar's process ended: its jobs fail now, and a new one takes its place
        (its state directory gives it back the psets and the job history)."""
        if self._closed:
            return
        why, self._killed_why = self._killed_why, None
        if self.stream is not None:
            self.stream.gone_now(why or f"the dask-pmix sidecar exited (status {status})")
        self._restarting = asyncio.get_running_loop().create_future()
        self._soon(self._restart_sidecar())

    async def _restart_sidecar(self) -> None:
        try:
            await self._restart_sidecar_now()
        finally:
            if self._restarting is not None and not self._restarting.done():
                self._restarting.set_result(None)

    async def _restart_sidecar_now(self) -> None:
        embedded = self.embedded
        if embedded is None or self._closed:
            return
        try:
            await embedded.restart()
        except SidecarError as e:
            logger.error("dask-pmix: could not restart the sidecar: %s", e)
            return
        embedded.on_exit(self._sidecar_exited)
        self.comm_cache.clear("sidecar restarted")
        for address in list(self.scheduler.workers):
            self._register_soon(address)
        logger.warning(
            "dask-pmix: the sidecar is back (restart %d); %d workers registered again",
            embedded.restarts,
            len(self.scheduler.workers),
        )
        await self._registered()
        await self._tell_workers_sidecar_restarted()

    async def _tell_workers_sidecar_restarted(self) -> None:
        """Pool sessions made with a sidecar that has died cannot serve again: each worker whose
        session is not in the new sidecar's pool leaves it and asks to be replaced (its data moved
        first)."""
        try:
            seats = [w.get("pool") or {} for w in await self.sidecar.workers()]
        except SidecarError as e:
            logger.warning("dask-pmix: could not read the new sidecar's pool: %s", e)
            return
        namespaces = sorted({s["namespace"] for s in seats if s.get("namespace") and s.get("state") != "retired"})
        for worker in self._listening & set(self.scheduler.workers):
            self.scheduler.stream_comms[worker].send({"op": Stream.SIDECAR_RESTARTED, "namespaces": namespaces})

    def _soon(self, coro) -> asyncio.Future:
        """A background call, awaited (with a bound) when the plugin closes."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- what the sidecar says ------------------------------------------------------------------
    def _event(self, kind: str, body: dict) -> None:
        if kind == "jobStateChanged":
            changed = body.get("jobStateChanged") or {}
            job = changed.get("job")
            if job:
                self._job_changed(*self.jobs.apply(job))
        elif kind == "memberStateChanged":
            changed = body.get("memberStateChanged") or {}
            entry = self.jobs.member_changed(
                changed.get("jobId", ""), changed.get("workerId", ""), changed.get("to", ""), changed.get("reason", "")
            )
            # Members that left a failed job keep MPI progressing until the others have left too.
            if entry is not None and not entry.active:
                self._push(entry)
                self._wake_gone()
        elif kind == "workerStateChanged":
            changed = body.get("workerStateChanged") or {}
            self.jobs.worker_state(changed.get("workerId", ""), changed.get("to", ""), changed.get("jobId"))
            if self.elastic is not None and changed.get("to") != "frozen":
                # A drain waits until none of its workers is frozen, which the sidecar lifts
                # after the job's end (that woke it already, usually too early).
                self.elastic.wake()
        elif kind == "psetDefined":
            pset = (body.get("psetDefined") or {}).get("pset") or {}
            self._psets[pset.get("name", "")] = list(pset.get("members") or ())
        elif kind == "psetDeleted":
            self._psets.pop((body.get("psetDeleted") or {}).get("name", ""), None)
        elif kind == "workerLeft":
            left = (body.get("workerLeft") or {}).get("workerId", "")
            self.jobs.worker_state(left, "gone", None)
            self.joining.gone(left)
            if self.elastic is not None:
                self.elastic.wake()
        elif kind == "healthChanged":
            changed = body.get("healthChanged") or {}
            self._health_changed(changed.get("status", ""), float(changed.get("pmixStalledSeconds") or 0))

    def _health_changed(self, status: str, stalled_for: float = 0.0) -> None:
        """libpmix inside the sidecar stopped progressing: a wedged PMIx server serves no job again,
        so an embedded sidecar still stalled after `dask-pmix.timeouts.pmix-stalled` is replaced by
        a new one, as after a crash."""
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if status != "pmix-stalled" or self._closed:
            return
        bound = config.seconds("timeouts.pmix-stalled") or 30.0
        logger.error(
            "dask-pmix: the sidecar's PMIx server has stopped progressing; %s",
            f"it is restarted if it still has not in {bound:g} s"
            if self.embedded is not None
            else "an external sidecar must be restarted by whoever runs it",
        )
        if self.embedded is not None:
            self._stalled = asyncio.get_running_loop().call_later(bound, self._kill_stalled, stalled_for + bound)

    def _kill_stalled(self, seconds: float) -> None:
        self._stalled = None
        proc = self.embedded.proc if self.embedded is not None else None
        if proc is not None and proc.poll() is None:
            logger.error(
                "dask-pmix: the sidecar's PMIx server is still stalled; killing the sidecar to start a new one"
            )
            # The running jobs fail with this reason when the exit is seen (_sidecar_exited).
            self._killed_why = (
                f"the dask-pmix sidecar's PMIx server stalled (no progress for {seconds:.0f} s); "
                "the sidecar was killed and a new one started in its place"
            )
            proc.kill()  # a wedged libpmix never finalizes: its exit is what the plugin restarts on

    async def _resync(self) -> None:
        health = await self.sidecar.health()
        started = time.time() - float(health.get("uptimeSeconds") or 0)
        restarted = self._sidecar_started is not None and abs(started - self._sidecar_started) > 5
        self._sidecar_started = started
        if restarted and self.embedded is None:
            # Someone else restarted the sidecar this plugin uses: it knows no worker any more.
            logger.warning("dask-pmix: the sidecar at %s was restarted; registering the workers again", self.url)
            self.comm_cache.clear("sidecar restarted")
            for address in list(self.scheduler.workers):
                self._register_soon(address)
            self._soon(self._registered()).add_done_callback(
                lambda _: self._soon(self._tell_workers_sidecar_restarted())
            )
        jobs, workers, psets = await asyncio.gather(self.sidecar.jobs(), self.sidecar.workers(), self.sidecar.psets())
        self._psets = {p["name"]: list(p.get("members") or ()) for p in psets}
        for entry, before in self.jobs.reset(jobs, workers):
            self._job_changed(entry, before)
        self.barriers.wake()

    def _job_changed(self, entry: Entry, before: str | None) -> None:
        """Members and owners hear of a job when it ends (failed, aborted, completed): a member acts
        only on a failure, a client waits for the end. `before`: the state it changed from ("" for a
        job first seen now, None for no change)."""
        if entry.active or before is None:
            return
        self.comm_cache.job_ended(entry.id, entry.state == "completed", named_dead(entry.view))
        if self.elastic is not None:
            self.elastic.wake()
        reused = self._reused_at.pop(entry.id, None)
        if reused is not None:
            reused.cancel()
        if entry.state != "completed":
            asyncio.get_running_loop().call_soon(self._stranded, entry.id)
        self._push(entry, to_owner=True)
        self.barriers.wake(entry.id)
        timer = self._settling.pop(entry.id, None)
        if timer is not None:
            timer.cancel()

    def _push(self, entry: Entry, to_owner: bool = False) -> None:
        """The job as it is now, to its members' workers and (a change of state) its owner."""
        msg = {"op": Stream.JOB, "job": entry.view}
        for worker in set(entry.workers):
            comm = self.scheduler.stream_comms.get(worker)
            if comm is not None and worker in self._listening:
                try:
                    comm.send(msg)
                except Exception:  # noqa: BLE001 - a worker going away: Dask handles that
                    pass
        if to_owner and entry.owner:
            self.scheduler.report(
                {"op": "event", "topic": Topic.JOB, "event": (time.time(), entry.view)}, client=entry.owner
            )

    def _sidecar_gone(self, reason: str) -> None:
        self.comm_cache.clear("sidecar gone")
        for entry in self.jobs.active():
            self.jobs.fail_here(entry, reason)
            self._job_changed(entry, "running")

    def _hello(self, worker: str, **_: Any) -> None:
        self._listening.add(worker)

    def _members_of(self, job_id: str) -> set[str] | None:
        entry = self.jobs.get(job_id)
        return set(entry.workers) if entry is not None else None

    # -- membership -------------------------------------------------------------------------------
    def add_worker(self, scheduler, worker: str) -> None:
        if self.replacer is not None:
            self.replacer.added(worker)
        ws = scheduler.workers.get(worker)
        if ws is not None:
            self.returning.joined(worker, ws.host)
        self._register_soon(worker)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str | None = None, **kwargs) -> None:
        # The sidecar fails any job this worker is in, which releases the other members.
        if self.replacer is not None:
            self.replacer.removed(worker)
        self._listening.discard(worker)
        self.joining.gone(worker)
        self.comm_cache.worker_left(worker)
        if self.elastic is not None:
            self.elastic.forget(worker)
        self._wake_gone()
        pending = self._registrations.pop(worker, None)
        host, nanny = self._known.pop(worker, ("", False))
        replacing = self.replacer is not None and self.replacer.replacing(worker)
        returning = bool(host) and comes_back(nanny, stimulus_id, replacing)
        if returning:
            self.returning.left(worker, host)
        if self._closed or self.rest is None:
            return
        if replacing:
            reason = "dask-pmix replaces it"
        elif returning:
            reason = "removed by Dask; its nanny restarts it"
        elif (stimulus_id or "").startswith("retire-workers"):
            reason = "retired by Dask"
        else:
            reason = "removed by Dask"

        async def remove() -> None:
            if pending is not None:
                await asyncio.wait([pending])
            try:
                await self.sidecar.remove_worker(worker, reason=reason, returning=returning)
            except SidecarError as e:
                if e.status != 404:
                    logger.warning("dask-pmix: could not remove worker %s: %s", worker, e)

        task = self._removals[worker] = self._soon(remove())
        task.add_done_callback(lambda t: self._removals.pop(worker, None) if self._removals.get(worker) is t else None)

    def _register_soon(self, address: str) -> None:
        if self._closed or self.rest is None:  # start() registers the workers there are
            return
        ws = self.scheduler.workers.get(address)
        if ws is None:
            return
        self._known[address] = (ws.host, bool(ws.nanny))
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
                await self.sidecar.register_worker(body)
            except SidecarError as e:
                if e.status != 409:  # already known: a re-registration after a restart
                    logger.warning("dask-pmix: could not register worker %s: %s", address, e)

        self._registrations[address] = self._soon(register())

    async def _registered(self, addresses: list[str] | None = None) -> None:
        pending = [f for a, f in self._registrations.items() if addresses is None or a in addresses]
        if pending:
            await asyncio.wait(pending)

    # -- jobs submitted before they are admitted (submit_mpi) ------------------------------------
    def update_graph(self, scheduler, *, client: str, annotations: dict, stimulus_id: str, **kwargs) -> None:
        """A graph with the rank tasks of jobs not yet admitted: their tasks are held (queued.hold,
        before Dask places them) and their requests go to the sidecar one after another, in the
        order they came, each once the one before waits in the admission line."""
        if QUEUED_ANNOTATION not in annotations:
            return
        for ticket, (keys, request, wrong) in queued.queued_jobs(annotations).items():
            if ticket in self._queued or ticket in self._admitted:
                continue
            queued.hold(scheduler, keys)
            q = self._queued[ticket] = queued.Queued(ticket, client, request, keys)
            if wrong or self._closed:
                # After update_graph's own transitions, which put the tasks in no-worker.
                asyncio.get_running_loop().call_soon(self._refused, q, wrong or "the scheduler is closing")
                continue
            before, self._last_in_line = self._last_in_line, q.in_line
            q.task = self._soon(self._admit(q, before))

    async def _admit(self, q: queued.Queued, before: asyncio.Future | None) -> None:
        try:
            if before is not None:
                await before
            if q.withdrawn:
                return
            request = dict(q.request)
            wait = request.pop("wait", None)
            answer = await self.create_job(**request, owner=q.client, wait=wait, on_queued=lambda: _done(q.in_line))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a fault here must not leave the futures waiting forever
            logger.exception("dask-pmix: job request %s failed", q.ticket)
            answer = {"error": f"the scheduler plugin could not ask the sidecar ({type(e).__name__}: {e})"}
        finally:
            _done(q.in_line)
        if self._queued.get(q.ticket) is not q:  # withdrawn while its answer came
            if "job" in answer:
                await self._end(answer["job"]["id"], "its rank tasks were cancelled while it waited for admission")
            return
        if "error" in answer:
            self._refused(q, answer["error"])
            return
        job = answer["job"]
        del self._queued[q.ticket]
        self._admitted[q.ticket] = job["id"]
        while len(self._admitted) > ENDED_KEPT:
            self._admitted.popitem(last=False)
        if len(job.get("members") or ()) != len(q.keys):
            # A pset whose members changed between the count and the admission.
            why = f"the job was admitted with {len(job.get('members') or ())} members for {len(q.keys)} rank tasks"
            queued.fail(self.scheduler, q.keys, MPIJobError(why, job_id=job["id"]), f"dask-pmix-mismatch-{q.ticket}")
            await self._end(job["id"], why)
            return
        gone = queued.held(self.scheduler, q.keys)
        if gone:
            # A rank's task left while the job was being admitted (its transition came before the
            # ticket was mapped to the job): the others err, and the members go back.
            why = "a rank's task was cancelled as the job was admitted"
            queued.fail(self.scheduler, q.keys, MPIJobError(why, job_id=job["id"]), f"dask-pmix-cancelled-{q.ticket}")
            await self._end(job["id"], why)
            return
        queued.release(self.scheduler, q.keys, job, answer.get("envs") or {}, f"dask-pmix-admitted-{job['id']}")
        if job.get("mode") == "fork" and job.get("modeReason") and q.request.get("mode") != "fork":
            fallback = {"id": job["id"], "modeReason": job["modeReason"]}
            self.scheduler.report(
                {"op": "event", "topic": Topic.FALLBACK, "event": (time.time(), fallback)}, client=q.client
            )

    def _refused(self, q: queued.Queued, error: str) -> None:
        if self._queued.get(q.ticket) is q:
            del self._queued[q.ticket]
        queued.fail(self.scheduler, q.keys, MPIJobError(error), f"dask-pmix-refused-{q.ticket}")

    def _withdraw(self, q: queued.Queued) -> None:
        """A held rank task was released (its future cancelled or dropped): the request leaves the
        sidecar's line (its connection closes) and the job's other rank tasks err."""
        self._queued.pop(q.ticket, None)
        q.withdrawn = True
        if q.task is not None:
            q.task.cancel()
        why = MPIJobError("a rank's task was cancelled while the job waited for admission; the job was withdrawn")
        # Not from within Dask's transition: after it.
        stimulus = f"dask-pmix-withdrawn-{q.ticket}"
        asyncio.get_running_loop().call_soon(queued.fail, self.scheduler, q.keys, why, stimulus)

    def transition(self, key, start: str, finish: str, *args, **kwargs) -> None:
        """A rank's task: once every rank's has finished, the job is over (an in-process job's members
        are told to leave here, all at once: the scheduler sees their tasks finish; a fork job's ranks
        finalize themselves, and one still active SETTLE s later is ended); a rank's task dropped
        before it finished (its future cancelled, or released by every client that held it) ends
        its job at once, giving the members back."""
        match = RANK_KEY.match(key) if isinstance(key, str) else None
        if match is None or self._closed or self.rest is None:
            return
        waiting = self._queued.get(match.group(1))
        if waiting is not None:
            if finish in ("released", "forgotten") and start == "no-worker":
                self._withdraw(waiting)
            return
        if start == "memory" and finish == "released":
            ts = self.scheduler.tasks.get(key)
            if ts is not None and any(w not in self.scheduler.workers for w in ts.worker_restrictions or ()):
                self._results_lost.add(key)  # the rank had returned; its result went with its worker
        elif finish == "no-worker" and key in self._results_lost:
            # Dask would run the rank's task again on its worker, which is gone, and its future
            # would wait for good: nothing can compute a rank's result again. (A rank whose worker
            # died while it ran is the sidecar's to report: the job fails, naming the member.)
            self._results_lost.discard(key)
            ts = self.scheduler.tasks[key]
            worker = next(iter(ts.worker_restrictions or ()), "")
            job_id = self._admitted.get(match.group(1), match.group(1))
            asyncio.get_running_loop().call_soon(self._result_lost, key, job_id, int(match.group(2)), worker)
            return
        elif finish in ("memory", "erred", "forgotten", "processing"):
            self._results_lost.discard(key)
        entry = self.jobs.get(self._admitted.get(match.group(1), match.group(1)))
        if entry is not None and finish == "no-worker" and not entry.active and entry.state != "completed":
            # Its worker left after the job was seen to fail (usually the other way round).
            asyncio.get_running_loop().call_soon(self._stranded, entry.id)
            return
        if entry is None or not entry.active:
            return
        if finish == "memory":
            entry.ranks_done.add(int(match.group(2)))
            if len(entry.ranks_done) >= len(entry.workers) and entry.id not in self._settling:
                if entry.view.get("mode") == "inprocess":
                    self._settling[entry.id] = None
                    self._soon(self._complete(entry.id))
                else:
                    loop = asyncio.get_running_loop()
                    self._settling[entry.id] = loop.call_later(SETTLE, self._settled, entry.id)
            return
        if finish not in ("released", "forgotten") or start in ("memory", "erred", "released", "forgotten"):
            return
        member = entry.worker_of(int(match.group(2)))
        if member is not None and member not in self.scheduler.workers:
            # Its worker is gone (Dask removes it from its workers before it releases the worker's
            # tasks, whichever path told it: the worker's stream closing, its nanny, a restart),
            # not the task dropped: the sidecar fails the job itself, naming the member (ending
            # the job now would lose who ended it).
            return
        if str(kwargs.get("stimulus_id") or "").startswith(RESTART_STIMULI):
            why = "the cluster was restarted (client.restart()) while the job ran: Dask released every task"
        else:
            why = "a rank's task was cancelled (its future was released)"
        self._soon(self._end(entry.id, why))

    def _result_lost(self, key: str, job_id: str, rank: int, worker: str) -> None:
        if stranded.result_lost(self.scheduler, key, job_id, rank, worker):
            logger.info("dask-pmix: job %s: rank %d's result was lost with its worker %s", job_id, rank, worker)

    def _stranded(self, job_id: str) -> None:
        """The failed job's ranks whose worker left while they ran: their futures raise."""
        entry = self.jobs.get(job_id)
        if entry is None or entry.active or self._closed:
            return
        prefixes = [job_id, *(t for t, j in self._admitted.items() if j == job_id)]
        erred = stranded.lost_while_running(self.scheduler, entry, prefixes)
        if erred:
            logger.info("dask-pmix: job %s: %s erred, their workers gone", job_id, ", ".join(erred))

    async def _complete(self, job_id: str) -> None:
        """Every rank of the in-process job returned: its members leave it, all at once."""
        try:
            job = await self.sidecar.complete_job(job_id)
        except SidecarError as e:
            if e.status not in (404, 409):
                logger.warning("dask-pmix: could not complete job %s: %s", job_id, e)
            return
        self._job_changed(*self.jobs.apply(job))

    def _settled(self, job_id: str) -> None:
        self._settling.pop(job_id, None)
        entry = self.jobs.get(job_id)
        if entry is not None and entry.active:
            self._soon(
                self._end(job_id, f"every rank returned, but the job was still {entry.state} {SETTLE:g} s later")
            )

    async def _end(self, job_id: str, why: str) -> dict:
        """Ends the job now (aborted, its members given back)."""
        try:
            job = await self.sidecar.delete_job(job_id, why)
        except SidecarError as e:
            return {"id": job_id, "error": str(e)}
        if job:
            self._job_changed(*self.jobs.apply(job))
        logger.debug("dask-pmix: job %s ended: %s", job_id, why)
        return job or {"id": job_id}

    def log_event(self, topic, msg) -> None:
        """A worker that Dask begins to retire (cluster.scale(), retire_workers(), a worker's
        lifetime) while it is a member of a job will be closed once its data has moved: its job
        fails now, saying so, instead of at the close as 'its worker finalized its MPI session'."""
        if not isinstance(msg, dict) or msg.get("action") != "worker-status-change" or self._closed:
            return
        if msg.get("status") != "closing_gracefully" or not isinstance(topic, str):
            return
        for entry in self.jobs.active():
            if topic in entry.workers:
                why = (
                    "its worker is being retired by Dask (cluster.scale(), client.retire_workers() or the "
                    "worker's lifetime) while the job ran; MPI jobs do not shrink"
                )
                self._soon(self.member_lost(entry.id, topic, why))

    def remove_client(self, scheduler, client: str) -> None:
        for entry in self.jobs.active():
            if entry.owner == client:
                self._soon(self._end(entry.id, f"its client {client} left"))

    def valid_workers_downscaling(self, scheduler, workers: list) -> list:
        """Workers the sidecar holds for a job, or that a waiting job request names (itself or
        through its pset), stay; so do as many workers as the largest waiting request for a number
        of workers needs, and workers whose MPI session starts with others of its cohort
        (scheduler.joining)."""
        keep = set(self.jobs.frozen) | self.joining.held()
        for entry in self.jobs.active():
            keep.update(entry.workers)
        need = 0
        for request in self._waiting:
            named = request.get("members") or self._psets.get(str(request.get("pset") or ""))
            keep.update(named or ())
            need = max(need, int((request.get("selector") or {}).get("count") or 0))
        allowed = [ws for ws in workers if ws.address not in keep]
        spare = len(scheduler.workers) - need
        return allowed[: max(0, min(len(allowed), spare))]

    def frozen_workers(self) -> set[str]:
        return set(self.jobs.frozen) | {w for e in self.jobs.active() for w in e.workers}

    # -- handlers (called by clients and workers through the scheduler) ---------------------------
    async def info(self) -> dict:
        # The token goes to Dask clients of this scheduler: they may run code on the scheduler
        # anyway (run_on_scheduler), so they learn nothing they could not read from this object.
        return {"url": self.url, "token": self.token, "embedded": self.embedded is not None}

    async def create_job(
        self,
        workers: list[str] | None = None,
        n: int | None = None,
        pset: str | None = None,
        impl: str = "openmpi",
        owner: str | None = None,
        timeout: float | None = None,
        wiring_timeout: float | None = None,
        labels: dict | None = None,
        placement: str | None = None,
        mode: str | None = None,
        strict: bool = False,
        *,
        wait: float | None = None,
        on_queued: Callable[[], None] | None = None,
    ) -> dict:
        """The job, once the sidecar admitted it (the request waits in the admission line for up to
        `wait` s, by default dask-pmix.timeouts.admission), with its fork members' environments;
        or {"error", "status"}. `on_queued` (the plugin's own, for jobs submitted before they are
        admitted) is called once the request waits in line, or with its answer."""
        # Workers that left within the job's wiring timeout and are expected back: the job waits
        # for them in the sidecar (within that timeout); more than those and the cluster fails now.
        window = float(wiring_timeout or config.seconds("timeouts.wiring") or 60.0)
        unusable = _membership_mistake(self.scheduler, workers, n, self.returning, window)
        if unusable:
            return {"error": unusable, "status": 422}
        if self._restarting is not None and not self._restarting.done():
            # The embedded sidecar died and a new one is starting: the job waits for it.
            await asyncio.wait([self._restarting], timeout=config.seconds("timeouts.start") or 120.0)
        await self._registered(workers)
        leaving = list(self._removals.values()) + (self.replacer.taking_out() if self.replacer else [])
        if leaving:
            # The sidecar hears of every worker that Dask removed, or that dask-pmix replaces, before
            # it chooses this job's members.
            await asyncio.wait(leaving)
        request: dict[str, Any] = {"impl": impl}
        if mode:
            request["mode"] = mode
        if mode == "inprocess":
            request["strictMode"] = bool(strict)
            request["poolJoinSeconds"] = config.seconds("timeouts.pool-join") or 0.0
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
        self._waiting.append(request)
        wait = config.seconds("timeouts.admission") if wait is None else wait
        try:
            if on_queued is not None and wait:
                job = await self._while_reachable(lambda: self.sidecar.create_job_in_line(request, wait, on_queued))
            else:
                job = await self._while_reachable(lambda: self.sidecar.create_job(request, wait=wait))
        except SidecarError as e:
            return {"error": str(e), "status": e.status}
        finally:
            self._waiting.remove(request)
        self.jobs.apply(job, owner=owner)
        try:
            # In-process members need no environment: they are in the pool already.
            fork = job.get("mode") == "fork"
            members = [m["workerId"] for m in job.get("members", [])] if fork else []
            answers = await asyncio.gather(*(self.sidecar.member_env(job["id"], m) for m in members))
            envs = {m: a["env"] for m, a in zip(members, answers)}
        except SidecarError as e:
            # Nobody will run this job: give its members back now, not after the wiring timeout.
            await self._end(job["id"], "its members' environments could not be read")
            return {"error": str(e), "status": e.status}
        return {"job": job, "envs": envs}

    async def _while_reachable(self, call):
        """`call()` on the sidecar; when it cannot be reached, asked again until it can, within
        `dask-pmix.timeouts.sidecar-gone` (or, for an embedded sidecar that died, until the new one
        is up): a sidecar stopping, restarting or stalled is not a reason to fail a request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (config.seconds("timeouts.sidecar-gone") or 10.0)
        pause = 0.1
        while True:
            try:
                return await call()
            except SidecarError as e:
                if e.status != 0 or self._closed:
                    raise
                restarting = self._restarting is not None and not self._restarting.done()
                if restarting:
                    await asyncio.wait([self._restarting], timeout=config.seconds("timeouts.start") or 120.0)
                elif loop.time() + pause > deadline:
                    raise
                else:
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 1.0)

    async def pset(self, name: str) -> dict:
        """The process set's members as the sidecar has them ({"members": None}: no such set)."""
        try:
            psets = await self.sidecar.psets()
        except SidecarError as e:
            return {"members": self._psets.get(name), "error": str(e)}
        found = next((p for p in psets if p.get("name") == name), None)
        return {"members": list(found.get("members") or ()) if found else None}

    async def job(self, job_id: str) -> dict:
        """The job as the sidecar has it (as this plugin last saw it, when the sidecar is gone)."""
        entry = self.jobs.get(job_id)
        if entry is not None and entry.failed_here:
            return {"id": job_id, **entry.view}
        try:
            return await self.sidecar.job(job_id)
        except SidecarError as e:
            if e.status == 404:
                return {"id": job_id, "state": "failed", "error": "the sidecar does not know this job"}
            return {"id": job_id, "state": "unknown", "error": str(e)}

    async def release_job(self, job_id: str) -> dict:
        """Ends the job if it is still active (its members are given back as they leave)."""
        entry = self.jobs.get(job_id)
        if entry is not None and not entry.active:
            return entry.view
        return await self._end(job_id, "released by its client")

    async def member_lost(self, job_id: str, worker: str, reason: str) -> dict | None:
        """A worker reports that its rank's process is gone (it killed it, or it died)."""
        try:
            return await self.sidecar.member_lost(job_id, worker, reason)
        except SidecarError as e:
            return {"id": job_id, "error": str(e)}

    def _wake_gone(self) -> None:
        for waiter in self._gone_waiters:
            waiter.set()

    async def workers_gone(self, workers: list[str], wait: float = 10.0, job_id: str | None = None) -> dict:
        """Answers once Dask has removed every one of `workers` and the sidecar has heard of it, and
        every member of the ended job `job_id` has left it, or after `wait` s, with the workers
        still there ({"left": [...]}, and "members": those still in the job): a job retried after a
        member was lost is chosen among the workers there are then (run_mpi's retries), and not on
        a member still inside the failed job (MPICH in process cannot revoke: such a member is
        replaced, its data moved, a few seconds after the failure)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, float(wait))
        while True:
            left = [w for w in workers if w in self.scheduler.workers]
            entry = self.jobs.get(job_id) if job_id else None
            inside = (
                [m["workerId"] for m in entry.view.get("members") or () if m.get("state") == MEMBER_CONNECTED]
                if entry is not None and not entry.active
                else []
            )
            remaining = deadline - loop.time()
            if not (left or inside) or remaining <= 0:
                break
            waiter = asyncio.Event()
            self._gone_waiters.add(waiter)
            try:
                await asyncio.wait_for(waiter.wait(), remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._gone_waiters.discard(waiter)
        removing = [self._removals[w] for w in workers if w in self._removals]
        if removing:
            await asyncio.wait(removing, timeout=max(0.1, deadline - loop.time()))
        return {"left": left, "members": inside}

    async def join_job(self, job_id: str, worker: str, wait: float = 10.0, ports: dict | None = None) -> dict:
        """An in-process member is there; answers when every member is (ready), or after at most
        `wait` s (not ready: the member asks again). See join_barrier."""
        entry = self.jobs.get(job_id)
        if entry is not None and not entry.active:
            return {"error": f"job {job_id} {entry.state}: {entry.view.get('error') or ''}".rstrip(": "), "status": 409}
        answer = await self.barriers.join(job_id, worker, wait, ports)
        return self._comm_plan(job_id, answer, ports is not None) if answer.get("ready") else answer

    def _comm_plan(self, job_id: str, answer: dict, worlds: bool) -> dict:
        """Every member's ready answer carries the job's one plan for its communicator
        (scheduler.comm_cache). The sidecar does not see a Dup: it hears from here that a job whose
        members duplicate a kept communicator runs, once it has run for REUSED_AFTER s (a shorter
        job costs no request for it: it goes from pending to completed, as its members finalize; its
        wiring timeout is far longer). An MPICH / Intel MPI job runs once its members joined there
        with their ports."""
        entry = self.jobs.get(job_id)
        members = sorted(entry.view.get("members") or (), key=lambda m: m["rank"]) if entry and entry.active else ()
        plan, made = self.comm_cache.plan(job_id, [m["workerId"] for m in members] or None)
        if made and plan["use"] is not None and not worlds:
            self._reused_at[job_id] = asyncio.get_running_loop().call_later(
                REUSED_AFTER, lambda: self._soon(self._reused(job_id, plan["use"]))
            )
        return {**answer, "comm": plan}

    async def _reused(self, job_id: str, kept: str) -> None:
        self._reused_at.pop(job_id, None)
        entry = self.jobs.get(job_id)
        if entry is None or not entry.active:
            return
        try:
            job = await self.sidecar.job_reused(job_id, kept)
        except SidecarError as e:
            if e.status == 404 and "route" in e.message.lower():
                # A sidecar older than the cache: it would wait for a group construct that never
                # comes, and fail the job at its wiring timeout. No job reuses one from now on.
                logger.warning("dask-pmix: the sidecar cannot start a job on a kept communicator; caching is off")
                self.comm_cache.bound = 0
                self.comm_cache.clear("the sidecar cannot serve it")
            elif e.status not in (404, 409):
                logger.warning("dask-pmix: could not tell the sidecar that job %s runs: %s", job_id, e)
            return
        self._job_changed(*self.jobs.apply(job))

    async def leave_job(
        self, job_id: str, worker: str, ok: bool, reason: str = "", failed_ranks: list | None = None
    ) -> dict:
        try:
            return await self.sidecar.leave_job(job_id, worker, bool(ok), reason, failed_ranks or [])
        except SidecarError as e:
            return {"error": str(e), "status": e.status}

    async def join_pool(
        self,
        worker: str,
        host: str = "",
        pid: int = 0,
        uid: int | None = None,
        gid: int | None = None,
        impl: str | None = None,
    ) -> dict:
        """A worker process joins the pool, saying who it is (its own host, pid, uid, gid) and, for
        MPICH / Intel MPI, which library it runs (it then joins as a world of its own). The first
        epoch's answer waits while the workers that start together gather into cohorts."""
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
        if self._closed:
            return {"error": "the scheduler is closing", "status": 503}
        try:
            answer = await self.sidecar.join_pool(worker, identity)
        except SidecarError as e:
            return {"error": str(e), "status": e.status}
        if isinstance(answer, dict) and answer.get("pool"):
            self.joining.answered(worker, answer["pool"])
        return answer

    async def pool_up(self, worker: str) -> dict:
        """The worker's MPI session is up: Dask may retire the members of its cohort again."""
        self.joining.started(worker)
        return {}

    async def leave_pool(self, worker: str, reason: str) -> dict:
        self.joining.started(worker)
        self.comm_cache.worker_left(worker)
        await self._registered([worker])
        try:
            return await self.sidecar.leave_pool(worker, reason)
        except SidecarError as e:
            return {"error": str(e), "status": e.status}

    async def replace_worker(self, worker: str, reason: str) -> dict:
        """A worker that cannot serve MPI jobs any more asks to be replaced (dask_pmix.scheduler.replace)."""
        if self.replacer is None:
            return {"error": "the dask-pmix plugin has not started", "status": 503}
        return self.replacer.replace(worker, reason)


def _done(f: asyncio.Future) -> None:
    if not f.done():
        f.set_result(None)


def _membership_mistake(
    scheduler, workers: list[str] | None, n: int | None, returning: Returning | None = None, window: float = 0.0
) -> str | None:
    """What is wrong with the members asked for, said so that the caller knows what to do. Workers
    expected back (`returning`, that left at most `window` s ago) count: the sidecar waits for them."""
    have = len(scheduler.workers)
    back = returning.count(window) if returning is not None else 0
    if n is not None and n > have + back:
        coming = f" (and {back} expected back)" if back else ""
        return (
            f"the job asks for {n} members but the cluster has {have} worker{'s' * (have != 1)}{coming}: ask for at "
            f"most {have + back}, or add workers first (cluster.scale(...), or start more `dask worker`s)"
        )
    unknown = [
        w
        for w in workers or []
        if w not in scheduler.workers and not (returning is not None and returning.has(w, window))
    ]
    if unknown:
        return (
            f"{', '.join(unknown)} {'is not a worker' if len(unknown) == 1 else 'are not workers'} of this "
            "cluster: pass addresses from client.scheduler_info()['workers']"
        )
    return None


def dask_setup(scheduler) -> None:
    """`dask scheduler --preload dask_pmix`: installs the plugin with its defaults."""
    scheduler.add_plugin(SidecarPlugin(), name=SidecarPlugin.name)
