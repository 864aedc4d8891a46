"""A sidecar whose PMIx server stops progressing is replaced: only libpmix's progress thread of the
running sidecar is stopped (ptrace, thread_stop.py), as a wedged libpmix would hold it, while an
in-process job (MPICH: a fork job) runs over persisted data. The sidecar reports pmix-stalled
(its HTTP side still answers), and once it has been stalled for dask-pmix.timeouts.pmix-stalled
the scheduler's plugin kills it and starts a new one: the job fails saying that the PMIx server
stalled, no chunk of the data is computed twice, the workers come back in the new sidecar's pool
(Open MPI: replaced after their data moved, as after a crash) and the next job succeeds."""

from __future__ import annotations

import time

import dask
import httpx
from distributed import wait

from dask_pmix import SidecarError, run_mpi

from .conftest import IMPL, start_cluster
from .test_inprocess import in_background, wait_pool_ready, workers_of
from .test_sidecar_gone import _chunk, long_job
from .thread_stop import ThreadStop, thread_named, thread_state

STALL_BOUND = 3.0  # dask-pmix.timeouts.pmix-stalled here (30 s by default)


def _health(sidecar) -> str | None:
    """The sidecar's health status (GET /v1/health answers 503 pmix-stalled while libpmix does
    not progress), None when it does not answer."""
    try:
        return httpx.get(f"{sidecar.url}/v1/health", timeout=1).json().get("status")
    except (httpx.HTTPError, ValueError):
        return None


def _ready(sidecar) -> list[str]:
    try:
        return [w["id"] for w in sidecar.workers() if (w.get("pool") or {}).get("state") == "ready"]
    except SidecarError:  # restarting
        return []


def test_a_stalled_pmix_server_gets_its_sidecar_replaced_and_loses_no_data(tmp_path):
    with dask.config.set({"dask-pmix.timeouts.pmix-stalled": f"{STALL_BOUND}s"}):
        cluster, client, sidecar = start_cluster(3)
        try:
            if IMPL == "openmpi":
                wait_pool_ready(sidecar, 3)
            workers = workers_of(client)
            plugin = cluster.scheduler.plugins["dask-pmix"]
            log = tmp_path / "computed"
            chunks = [client.submit(_chunk, i, str(log), pure=False, workers=[workers[i % 3]]) for i in range(12)]
            wait(chunks)

            job, outcome = in_background(lambda: run_mpi(client, long_job, n=3, impl=IMPL))
            deadline = time.monotonic() + 30
            while not [j for j in sidecar.jobs() if j["state"] == "running"]:
                assert time.monotonic() < deadline and job.is_alive(), outcome
                time.sleep(0.1)
            time.sleep(0.5)
            old = plugin.embedded.proc.pid
            progress = thread_named(old, "pmix-progress")  # the native addon names it
            seen_stalled = False
            with ThreadStop(progress) as stop:
                t_stop = time.monotonic()
                assert thread_state(old, progress) == "t"
                # The sidecar's HTTP side runs on, saying that libpmix does not progress.
                while plugin.embedded.proc is not None and plugin.embedded.proc.pid == old:
                    seen_stalled = seen_stalled or _health(sidecar) == "pmix-stalled"
                    assert time.monotonic() < t_stop + 60, "the stalled sidecar was not replaced"
                    time.sleep(0.2)
                job.join(30)
                assert not job.is_alive()
                stop.release()
            print(f"PMIx progress stopped -> job failed {outcome['at'] - t_stop:.1f} s later: {outcome.get('error')}")
            assert seen_stalled, "the sidecar never reported pmix-stalled"
            assert "error" in outcome, outcome
            assert "PMIx server stalled" in str(outcome["error"]), outcome["error"]
            # Not before the sidecar had stalled for its 5 s and the plugin's bound.
            assert outcome["at"] - t_stop >= 5 + STALL_BOUND - 1

            deadline = time.monotonic() + 120
            while plugin.embedded.restarts < 1 or _health(sidecar) != "ok":
                assert time.monotonic() < deadline, "no new sidecar"
                time.sleep(0.2)
            assert plugin.embedded.proc.pid != old and plugin.embedded.restarts == 1

            if IMPL == "openmpi":
                # The workers' pool sessions belonged to the dead sidecar: each is replaced by a new
                # process in the new sidecar's pool, its data moved first.
                deadline = time.monotonic() + 240
                while True:
                    now = workers_of(client)
                    if len(now) == 3 and not set(now) & set(workers) and len(_ready(sidecar)) == 3:
                        break
                    assert time.monotonic() < deadline, (now, [(w["id"], w.get("pool")) for w in sidecar.workers()])
                    time.sleep(0.5)
                assert run_mpi(client, lambda comm: comm.allreduce(1), n=3, impl=IMPL, mode="inprocess") == [3, 3, 3]
            else:
                assert run_mpi(client, lambda comm: comm.allreduce(1), n=3, impl=IMPL) == [3, 3, 3]
            assert [float(c.result()[0]) for c in chunks] == [float(i) for i in range(12)]
            assert sorted(int(x) for x in log.read_text().split()) == list(range(12)), "a chunk was computed twice"
        finally:
            client.close()
            cluster.close()
