"""The embedded sidecar killed outright comes back: the plugin restarts it (reaping the dead one),
registers the live workers again, the psets it had are back from its state directory, and the job
it was running when it died fails its caller and reads as failed from the restarted sidecar. The
workers' pool sessions were made with the dead sidecar and cannot serve again: each worker is
replaced, one at a time, after Dask moved its data (no chunk is computed twice); the pset then
names the workers that left, and jobs run in-process again on the new ones. The job across the
kill runs in fork mode, whose ranks are children of the workers."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from distributed import wait

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


def _chunk(i, log):
    import numpy as np

    with open(log, "a") as f:
        f.write(f"{i}\n")
    return np.full(1000, i, dtype="f8")


def test_a_killed_sidecar_is_restarted_with_its_psets_and_workers(tmp_path):
    cluster, client, sidecar = start_cluster(3)
    try:
        workers = sorted(client.scheduler_info()["workers"])
        log = tmp_path / "computed"
        chunks = [client.submit(_chunk, i, str(log), pure=False, workers=[workers[i % 3]]) for i in range(12)]
        wait(chunks)
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
        assert again.job(job_id)["state"] == "failed", again.job(job_id)
        if IMPL == "openmpi":
            # Every worker is replaced (its data moved first) and the new ones join the new pool.
            deadline = time.monotonic() + 240
            while True:
                now = sorted(client.scheduler_info()["workers"])
                ready = [w for w in again.workers() if (w.get("pool") or {}).get("state") == "ready"]
                if len(now) == 3 and not set(now) & set(workers) and len(ready) == 3:
                    break
                assert time.monotonic() < deadline, (now, [(w["id"], w.get("pool")) for w in again.workers()])
                time.sleep(0.5)
            pset = next(p for p in again.psets() if p["name"] == "kept")
            assert (pset["members"], sorted(pset.get("gone", []))) == (workers[:2], workers[:2])
            with pytest.raises(MPIJobError, match="left the cluster: redefine it"):
                run_mpi(client, _size, pset="kept", impl=IMPL)
            assert run_mpi(client, _size, n=3, impl=IMPL, mode="inprocess") == [3, 3, 3]
        else:
            # MPICH workers keep no session: they stay, and so does the pset.
            deadline = time.monotonic() + 30
            while sorted(w["id"] for w in again.workers()) != workers:
                assert time.monotonic() < deadline, again.workers()
                time.sleep(0.2)
            assert [(p["name"], p["members"]) for p in again.psets()] == [("kept", workers[:2])]
            assert run_mpi(client, _size, pset="kept", impl=IMPL) == [2, 2]
            assert run_mpi(client, _size, n=3, impl=IMPL) == [3, 3, 3]
        # No chunk was lost: every one is still there, computed once.
        assert [float(c.result()[0]) for c in chunks] == [float(i) for i in range(12)]
        assert sorted(int(x) for x in log.read_text().split()) == list(range(12)), "a chunk was computed twice"
    finally:
        client.close()
        cluster.close()
