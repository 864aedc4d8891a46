"""The embedded sidecar killed outright comes back: the plugin restarts it (reaping the dead one),
registers the live workers again, the psets it had are back from its state directory, the job it
was running when it died fails its caller and reads as failed from the restarted sidecar, and the
next run_mpi works. The job across the kill runs in fork mode, whose ranks are children of the
workers, so the workers stay; in-process members' own fate when the sidecar dies is another test's."""

from __future__ import annotations

import os
import signal
import threading
import time

from dask_pmix import MPIJobError, run_mpi
from dask_pmix.rest import SidecarClient

from .conftest import IMPL, start_cluster


def _size(comm):
    return comm.allreduce(1)


def _long_job(comm):
    for _ in range(600):
        comm.Barrier()
        time.sleep(0.05)
    return comm.rank


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

        # A job running on the pset when the sidecar dies (fork mode: the workers stay).
        outcome: dict = {}

        def run():
            try:
                outcome["results"] = run_mpi(client, _long_job, pset="kept", impl=IMPL, mode="fork")
            except MPIJobError as e:
                outcome["error"] = e

        caller = threading.Thread(target=run)
        caller.start()
        deadline = time.monotonic() + 30
        while not (running := [j for j in sidecar.jobs() if j["state"] == "running"]):
            assert time.monotonic() < deadline and caller.is_alive(), outcome
            time.sleep(0.1)
        job_id = running[0]["id"]

        os.kill(pid, signal.SIGKILL)
        caller.join(30)
        assert not caller.is_alive(), "run_mpi still waits on a job whose sidecar was killed"
        assert "error" in outcome, outcome
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
        assert again.job(job_id)["state"] == "failed", again.job(job_id)
        assert run_mpi(client, _size, pset="kept", impl=IMPL) == [2, 2]
        assert run_mpi(client, _size, n=3, impl=IMPL) == [3, 3, 3]
    finally:
        client.close()
        cluster.close()
