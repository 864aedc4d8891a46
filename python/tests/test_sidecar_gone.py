"""A sidecar that dies (kill -9) or is stopped (SIGTERM) mid-job fails the running job within
2 s, with a reason that says so, instead of leaving run_mpi waiting on a job nobody serves."""

from __future__ import annotations

import re
import signal
import threading
import time

import pytest

from dask_pmix import MPIJobError, run_mpi

from .conftest import IMPL, start_cluster


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_dead_sidecar_fails_the_running_job_within_two_seconds(sig):
    cluster, client, sidecar = start_cluster(2)
    try:
        def long_job(comm):
            for _ in range(600):
                comm.Barrier()
                time.sleep(0.05)
            return comm.rank

        outcome: dict = {}

        def run():
            try:
                outcome["results"] = run_mpi(client, long_job, n=2, impl=IMPL)
            except MPIJobError as e:
                outcome["error"] = e
            outcome["at"] = time.monotonic()

        job = threading.Thread(target=run)
        job.start()
        deadline = time.monotonic() + 30
        while not [j for j in sidecar.jobs() if j["state"] == "running"]:
            assert time.monotonic() < deadline and job.is_alive(), outcome
            time.sleep(0.1)
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
    finally:
        client.close()
        cluster.close()
