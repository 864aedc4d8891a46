"""The control plane as users meet it: the first job right after the plugin starts runs in the
workers themselves, a stall of the sidecar fails nothing, any number of concurrent jobs queue
instead of deadlocking, and bad input gets a clear error."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster, wait

from dask_pmix import MPIFallbackWarning, MPIJobError, SidecarPlugin, run_mpi
from dask_pmix.rest import SidecarClient

from .conftest import IMPL, held_keys, start_cluster
from .test_inprocess import wait_pool_ready, workers_of

OPENMPI = IMPL == "openmpi"


def where_am_i(comm):
    from distributed import get_worker, worker_client

    # Dask's worker context is the rank's own: it may submit work to the cluster and wait for it.
    with worker_client() as client:
        assert client.submit(sum, [comm.rank, 1], pure=False).result() == comm.rank + 1
    return {"rank": comm.rank, "size": comm.size, "pid": os.getpid(), "worker": get_worker().address}


@pytest.mark.skipif(not OPENMPI, reason="the in-process pool is Open MPI's by default")
def test_the_first_job_right_after_the_plugin_starts_runs_in_the_workers():
    with LocalCluster(n_workers=4, threads_per_worker=2, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(SidecarPlugin())
        with warnings.catch_warnings():
            warnings.simplefilter("error", MPIFallbackWarning)  # a fallback fails the test
            results = run_mpi(client, where_am_i, n=4)
        pids = client.run(os.getpid)
        assert [r["rank"] for r in results] == [0, 1, 2, 3]
        for r in results:
            assert r["size"] == 4
            assert pids[r["worker"]] == r["pid"], "a rank ran outside its worker's process"


def test_inprocess_asked_for_never_falls_back_and_the_default_says_why_it_does():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(SidecarPlugin(pool=False))
        with pytest.raises(MPIJobError, match=r"asked to run in-process, but .*do not join the pool"):
            run_mpi(client, where_am_i, n=2, impl=IMPL, mode="inprocess")
        with pytest.warns(MPIFallbackWarning, match=r"run in fork mode .*do not join the pool"):
            with pytest.raises(MPIJobError, match=r"fork mode.*get_worker\(\)"):
                run_mpi(client, where_am_i, n=2, impl=IMPL)
        # A loop of jobs that fall back for one reason warns once, as Python's default filter
        # shows a warning once per call site and text.
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            for _ in range(3):
                assert run_mpi(client, lambda comm: comm.allreduce(1), n=2, impl=IMPL) == [2, 2]
        assert [type(w.message) for w in seen] == [MPIFallbackWarning], [str(w.message) for w in seen]


def ten_seconds_of_barriers(comm):
    for _ in range(100):
        comm.Barrier()
        time.sleep(0.1)
    return comm.allreduce(comm.rank)


def _sidecar_pid(client) -> int:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dask-pmix"].embedded.proc.pid)


@pytest.mark.parametrize("stall", [2.0, 4.0])
def test_a_stalled_sidecar_fails_nothing(stall):
    cluster, client, sidecar = start_cluster(4)
    try:
        wait_pool_ready(sidecar, 4) if OPENMPI else None
        import dask.array as da

        x = da.random.random((2000, 2000), chunks=(500, 500)).persist()
        wait(x)
        total = float(x.sum().compute())
        held = held_keys(client, x.name)
        pids = client.run(os.getpid)
        outcome: dict = {}

        def job() -> None:
            try:
                outcome["results"] = run_mpi(client, ten_seconds_of_barriers, n=3, impl=IMPL)
            except Exception as e:  # noqa: BLE001
                outcome["error"] = e

        t = threading.Thread(target=job)
        t.start()
        deadline = time.monotonic() + 60
        while not any(j["state"] == "running" for j in sidecar.jobs()):
            assert time.monotonic() < deadline and t.is_alive(), outcome
            time.sleep(0.05)
        time.sleep(1.0)
        pid = _sidecar_pid(client)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(stall)
        finally:
            os.kill(pid, signal.SIGCONT)
        t.join(60)
        assert not t.is_alive()
        assert "error" not in outcome, outcome
        assert outcome["results"] == [3, 3, 3]
        assert client.run(os.getpid) == pids, "a worker was restarted"
        assert held_keys(client, x.name) == held
        assert np.isclose(float(x.sum().compute()), total)
        assert _sidecar_pid(client) == pid, "the sidecar was restarted"
    finally:
        client.close()
        cluster.close()


def small_allreduce(comm, tag):
    return tag, comm.allreduce(1)


@pytest.fixture(scope="module")
def busy_cluster():
    cluster, client, sidecar = start_cluster(4)
    if OPENMPI:
        wait_pool_ready(sidecar, 4)
    yield cluster, client, sidecar
    client.close()
    cluster.close()


def _run_jobs(client, tag: str, sizes: list[int], out: list, errors: list) -> None:
    for i, n in enumerate(sizes):
        try:
            got = run_mpi(client, small_allreduce, f"{tag}-{i}", n=n, impl=IMPL, timeout=120)
            out.append((got, n, f"{tag}-{i}"))
        except Exception as e:  # noqa: BLE001
            errors.append(f"{tag}-{i}: {e!r}")


def test_sixteen_concurrent_jobs_from_eight_threads_all_complete(busy_cluster):
    _, client, _ = busy_cluster
    out: list = []
    errors: list = []
    threads = [threading.Thread(target=_run_jobs, args=(client, f"t{t}", [2 + (t + k) % 3 for k in range(2)], out, errors))
               for t in range(8)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    print(f"16 jobs from 8 threads in {time.monotonic() - t0:.1f} s")
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(out) == 16
    for got, n, tag in out:
        assert got == [(tag, n)] * n


def test_two_clients_with_four_threads_each_all_complete(busy_cluster):
    cluster, _, _ = busy_cluster
    out: list = []
    errors: list = []
    with Client(cluster.scheduler_address) as a, Client(cluster.scheduler_address) as b:
        threads = [threading.Thread(target=_run_jobs, args=(c, f"{name}{t}", [2, 3], out, errors))
                   for name, c in (("a", a), ("b", b)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(out) == 16


@pytest.mark.parametrize("options, message", [
    ({"n": 0}, "n must be a positive whole number"),
    ({"n": 2.5}, "n must be a positive whole number"),
    ({"n": True}, "n must be a positive whole number"),
    ({"timeout": 0}, "timeout must be a positive number of seconds"),
    ({"timeout": -1}, "timeout must be a positive number of seconds"),
    ({"wiring_timeout": 0}, "wiring_timeout must be a positive number"),
    ({"workers": "tcp://x:1"}, "workers must be a non-empty list"),
    ({"mode": "threads"}, "mode must be 'inprocess' or 'fork'"),
])
def test_bad_options_are_refused_with_a_clear_error(busy_cluster, options, message):
    _, client, sidecar = busy_cluster
    before = len(sidecar.jobs())
    with pytest.raises(ValueError, match=message):
        run_mpi(client, small_allreduce, "x", impl=IMPL, **options)
    assert len(sidecar.jobs()) == before, "a job was created"


def test_an_argument_that_cannot_be_pickled_is_named(busy_cluster):
    _, client, _ = busy_cluster
    with pytest.raises(TypeError, match=r"argument 2 of the MPI job \(a _thread\.lock\) cannot be pickled"):
        run_mpi(client, small_allreduce, "x", threading.Lock(), n=2, impl=IMPL)
    # and the workers are given back: the next job runs on all of them
    assert run_mpi(client, small_allreduce, "y", n=4, impl=IMPL, timeout=60) == [("y", 4)] * 4


def returns_a_lock(comm):
    return threading.Lock()


def test_a_result_that_cannot_be_sent_back_is_said_so(busy_cluster):
    _, client, _ = busy_cluster
    with pytest.raises(Exception, match=r"(result|serialize|pickle)"):
        run_mpi(client, returns_a_lock, n=2, impl=IMPL, timeout=60)
    assert run_mpi(client, small_allreduce, "z", n=4, impl=IMPL, timeout=60) == [("z", 4)] * 4


def test_a_sidecar_client_outside_the_scheduler_still_works(busy_cluster):
    _, client, sidecar = busy_cluster
    assert isinstance(sidecar, SidecarClient)
    assert sidecar.health()["status"] in ("ok", "degraded")
    with dask.config.set({"dask-pmix.timeouts.request": "5s"}):
        assert {w["id"] for w in sidecar.workers()} >= set(workers_of(client))
