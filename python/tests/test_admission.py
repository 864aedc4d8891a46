"""Concurrent run_mpi calls on a cluster too small to run them all at once wait in the sidecar's
admission line and all succeed, instead of failing at once with 422."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from dask_pmix import run_mpi

from .conftest import IMPL


def _size(comm):
    return comm.allreduce(1)


def test_concurrent_run_mpi_calls_wait_for_workers(dask_cluster):
    _, client, _ = dask_cluster

    def calls(_):
        return [run_mpi(client, _size, n=3, impl=IMPL) for _ in range(3)]

    with ThreadPoolExecutor(4) as pool:
        results = [r for rs in pool.map(calls, range(4)) for r in rs]
    assert results == [[3, 3, 3]] * 12
