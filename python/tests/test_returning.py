"""A job submitted while the cluster is short of workers that are coming back waits for them, as Dask
tasks do: a worker killed outright (its nanny restarts it under a new address) and a worker that
dask-pmix replaces (retired, then restarted through its nanny). A request that could never be met
(more members than the cluster and the workers expected back together) still fails at once."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime

import pytest

from dask_pmix import MPIJobError, run_mpi

from .conftest import IMPL, start_cluster
from .test_inprocess import last_job, wait_pool_ready, workers_of


def _size(comm):
    return comm.allreduce(1)


async def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _until_gone(client, worker: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while worker in client.scheduler_info()["workers"]:
        assert time.monotonic() < deadline, f"{worker} is still a worker {timeout} s after it was killed"
        time.sleep(0.02)


def _members(sidecar) -> list[str]:
    return sorted(m["workerId"] for m in last_job(sidecar)["members"])


def _registered_after(sidecar, old: list[str], t: float) -> None:
    """The one worker not in `old` registered with the sidecar after `t` (wall clock): the job asked
    for before then waited for it."""
    new = [w for w in sidecar.workers() if w["id"] not in old]
    assert len(new) == 1, new
    assert datetime.fromisoformat(new[0]["registeredAt"]).timestamp() > t, (new[0], t)


def test_a_job_waits_for_workers_their_nannies_restart_and_fails_at_once_when_it_never_could_run():
    cluster, client, sidecar = start_cluster(3)
    try:
        if IMPL == "openmpi":  # MPICH jobs run in fork mode here: no pool to wait for
            wait_pool_ready(sidecar, 3)
        workers = workers_of(client)
        assert run_mpi(client, _size, n=3, impl=IMPL) == [3, 3, 3]

        # Killed outright: Dask removes it at once, and its nanny starts a new worker process.
        victim = workers[1]
        client.run(_die, workers=[victim], wait=False)
        _until_gone(client, victim)
        t_gone = time.monotonic()
        assert len(workers_of(client)) == 2  # the nanny's new worker takes a while to start
        # Never possible (more than the cluster and those coming back): at once, saying so.
        with pytest.raises(
            MPIJobError, match=r"the job asks for 8 members but the cluster has 2 workers \(and 1 expected back\)"
        ):
            run_mpi(client, _size, n=8, impl=IMPL)
        assert time.monotonic() - t_gone < 5.0
        # Every worker there was: it waits for the restarted one (within its wiring timeout).
        t_asked = time.time()
        assert run_mpi(client, _size, n=3, impl=IMPL, wiring_timeout=60) == [3, 3, 3]
        waited = time.monotonic() - t_gone
        now = workers_of(client)
        assert victim not in now and len(now) == 3
        assert _members(sidecar) == now
        _registered_after(sidecar, workers, t_asked)
        print(f"killed worker: the job waited {waited:.2f} s for its nanny to restart it")

        # Replaced by dask-pmix (out of the sidecar, retired, restarted through its nanny) while a
        # job is submitted: the job waits for the new worker.
        victim = now[0]

        async def replace(dask_scheduler, worker=victim):
            return await dask_scheduler.plugins["dask-pmix"].replace_worker(worker, "a test replaces it")

        t_replace = time.monotonic()
        assert client.run_on_scheduler(replace) == {"replacing": victim}
        t_asked = time.time()
        assert run_mpi(client, _size, n=3, impl=IMPL, wiring_timeout=60) == [3, 3, 3]
        after = workers_of(client)
        assert victim not in after and len(after) == 3
        assert _members(sidecar) == after
        _registered_after(sidecar, now, t_asked)
        print(f"replaced worker: the job took {time.monotonic() - t_replace:.2f} s")
    finally:
        client.close()
        cluster.close()
