"""The embedded sidecar killed outright comes back: the plugin restarts it (reaping the dead one),
registers the live workers again, the psets it had are back from its state directory, a job it
was running reads as failed, and the next run_mpi works."""

from __future__ import annotations

import os
import signal
import time

from dask_pmix import run_mpi
from dask_pmix.rest import SidecarClient

from .conftest import IMPL, start_cluster


def _size(comm):
    return comm.allreduce(1)


def _plugin_proc(client):
    def proc(dask_scheduler):
        plugin = dask_scheduler.plugins["dask-pmix"]
        return plugin.embedded.proc.pid, plugin.embedded.restarts

    return client.run_on_scheduler(proc)


def test_a_killed_sidecar_is_restarted_with_its_psets_and_workers(tmp_path):
    cluster, client, sidecar = start_cluster(3)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        sidecar.define_pset("kept", members=workers[:2])
        assert run_mpi(client, _size, pset="kept", impl=IMPL) == [2, 2]
        pid, restarts = _plugin_proc(client)
        assert restarts == 0

        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            new_pid, restarts = _plugin_proc(client)
            if restarts == 1 and new_pid != pid:
                break
            assert time.monotonic() < deadline, "the plugin did not restart the sidecar within 60 s"
            time.sleep(0.2)
        # The dead process was reaped: no zombie left behind.
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] != "Z"

        again = SidecarClient(sidecar.url, sidecar.token)
        deadline = time.monotonic() + 30
        while sorted(w["id"] for w in again.workers()) != workers:
            assert time.monotonic() < deadline, again.workers()
            time.sleep(0.2)
        assert [(p["name"], p["members"]) for p in again.psets()] == [("kept", workers[:2])]
        assert run_mpi(client, _size, pset="kept", impl=IMPL) == [2, 2]
        assert run_mpi(client, _size, n=3, impl=IMPL) == [3, 3, 3]
    finally:
        client.close()
        cluster.close()
