"""A real LocalCluster (worker processes) with the dask-pmix plugin and its embedded sidecar."""

from __future__ import annotations

import os

import pytest
from distributed import Client, LocalCluster

from dask_pmix import SidecarPlugin, wait_for_plugin
from dask_pmix.rest import SidecarClient

IMPL = os.environ.get("DASK_PMIX_TEST_IMPL", "openmpi")


def start_cluster(n_workers: int = 4, sidecar_args: list[str] | None = None, **kwargs):
    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=2, processes=True, dashboard_address=":0",
                           worker_dashboard_address=":0", **kwargs)
    client = Client(cluster)
    client.register_plugin(SidecarPlugin(sidecar_args=sidecar_args))
    info = wait_for_plugin(client)
    return cluster, client, SidecarClient(info["url"], info.get("token"))


def held_keys(client, name: str) -> dict:
    """The keys of the persisted collection `name` that each worker holds."""
    return client.run(lambda dask_worker: sorted(str(k) for k in dask_worker.data.keys() if name in str(k)))


@pytest.fixture(scope="module")
def dask_cluster():
    cluster, client, sidecar = start_cluster()
    yield cluster, client, sidecar
    client.close()
    cluster.close()


@pytest.fixture
def impl():
    return IMPL
