"""A sidecar that dies (kill -9) or is stopped (SIGTERM) mid-job fails the running job within 2 s,
with a reason that says so, and costs Dask nothing: the members of the in-process job live on (a
PMIx event handler of theirs keeps Open MPI from aborting them), no chunk of a persisted array is
computed again, the workers whose pool session belonged to the dead sidecar are replaced one at a
time after their data moved, the pset names the workers that left, and the next in-process job
runs on the workers there are now."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest
from distributed import wait

from dask_pmix import MPIJobError, SidecarError, run_mpi

from .conftest import IMPL, start_cluster
from .test_inprocess import wait_pool_ready, workers_of


def long_job(comm):
    for _ in range(600):
        comm.Barrier()
        time.sleep(0.05)
    return comm.rank


def _chunk(i, log):
    import numpy as np

    with open(log, "a") as f:
        f.write(f"{i}\n")
    return np.full(100_000, i, dtype="f8")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_sidecar_fails_the_running_job_within_two_seconds_and_loses_no_data(sig, tmp_path):
    cluster, client, sidecar = start_cluster(3)
    try:
        if IMPL == "openmpi":
            wait_pool_ready(sidecar, 3)
        workers = workers_of(client)
        sidecar.define_pset("pair", members=workers[:2])
        log = tmp_path / "computed"
        chunks = [client.submit(_chunk, i, str(log), pure=False, workers=[workers[i % 3]]) for i in range(12)]
        wait(chunks)
        outcome: dict = {}

        def run():
            try:
                outcome["results"] = run_mpi(client, long_job, pset="pair", impl=IMPL)
            except MPIJobError as e:
                outcome["error"] = e
            outcome["at"] = time.monotonic()

        job = threading.Thread(target=run)
        job.start()
        deadline = time.monotonic() + 30
        while not [j for j in sidecar.jobs() if j["state"] == "running"]:
            assert time.monotonic() < deadline and job.is_alive(), outcome
            time.sleep(0.1)
        time.sleep(0.5)
        proc = cluster.scheduler.plugins["dask-pmix"].embedded.proc
        t_kill = time.monotonic()
        proc.send_signal(sig)
        job.join(30)
        assert not job.is_alive()
        assert "error" in outcome, outcome
        print(f"sidecar {sig.name} -> MPIJobError in {outcome['at'] - t_kill:.2f} s: {outcome['error']}")
        assert outcome["at"] - t_kill < 2.0
        # The plugin's own report, or (when the restarted sidecar answered first) the restarted
        # sidecar's: the job it found interrupted in its state directory.
        assert re.search(r"sidecar (exited|received SIGTERM|stopped before the job ended)", str(outcome["error"])), \
            outcome["error"]

        if IMPL == "openmpi":
            # Every worker is replaced by a new process in the new sidecar's pool, its data moved first.
            deadline = time.monotonic() + 240
            while True:
                now = workers_of(client)
                try:
                    ready = [w for w in sidecar.workers() if (w.get("pool") or {}).get("state") == "ready"]
                except SidecarError:  # restarting
                    ready = []
                if len(now) == 3 and not set(now) & set(workers) and len(ready) == 3:
                    break
                assert time.monotonic() < deadline, (now, [(w["id"], w.get("pool")) for w in sidecar.workers()])
                time.sleep(0.5)
            pset = next(p for p in sidecar.psets() if p["name"] == "pair")
            assert sorted(pset.get("gone", [])) == sorted(workers[:2])
            assert run_mpi(client, lambda comm: comm.allreduce(1), n=3, impl=IMPL, mode="inprocess") == [3, 3, 3]
        else:
            assert run_mpi(client, lambda comm: comm.allreduce(1), pset="pair", impl=IMPL) == [2, 2]
        assert [float(c.result()[0]) for c in chunks] == [float(i) for i in range(12)]
        assert sorted(int(x) for x in log.read_text().split()) == list(range(12)), "a chunk was computed twice"
    finally:
        client.close()
        cluster.close()
