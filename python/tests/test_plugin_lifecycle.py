"""The plugin's own life cycle: closing the scheduler, with workers still attached, logs nothing
from dask-pmix (no failed worker removals against the sidecar it has just stopped, no "cannot
schedule new futures after shutdown" tracebacks)."""

from __future__ import annotations

import asyncio
import gc
import logging

from distributed import Client, Scheduler, Worker

from dask_pmix import SidecarPlugin


def test_closing_the_scheduler_logs_nothing_from_dask_pmix(caplog):
    async def run() -> None:
        scheduler = await Scheduler(dashboard_address=":0")
        await scheduler.register_scheduler_plugin(SidecarPlugin(), name=SidecarPlugin.name, idempotent=False)
        workers = [await Worker(scheduler.address, nthreads=1), await Worker(scheduler.address, nthreads=1)]
        client = await Client(scheduler.address, asynchronous=True)
        plugin = scheduler.plugins[SidecarPlugin.name]
        deadline = asyncio.get_running_loop().time() + 30
        while len(await plugin.rest.workers()) < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
        # The workers are attached once this process's MPI session has started (or failed): an
        # MPICH world whose sidecar hangs up in the middle of MPI_Init_thread dies there (its PMI
        # client exits the process, or reads the empty reply out of bounds), which is MPICH's.
        joins = [w.plugins["dask-pmix-pool"]._task for w in workers]
        await asyncio.wait_for(asyncio.gather(*joins), timeout=deadline - asyncio.get_running_loop().time())
        await client.close()
        await scheduler.close()  # stops the sidecar while the workers are still attached
        for w in workers:
            await w.close()
        await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
        gc.collect()  # unretrieved task exceptions are logged when their tasks are collected
    noise = [r.getMessage() for r in caplog.records
             if r.pathname.endswith("plugin.py") and r.name.startswith("dask_pmix")
             or "cannot schedule new futures" in r.getMessage()
             or ("never retrieved" in r.getMessage() and "dask_pmix" in str(r.exc_info or r.getMessage()))]
    assert noise == []


def test_a_job_whose_member_env_cannot_be_fetched_is_released_at_once():
    from dask_pmix.errors import SidecarError

    async def run() -> None:
        async with Scheduler(dashboard_address=":0") as scheduler:
            await scheduler.register_scheduler_plugin(SidecarPlugin(), name=SidecarPlugin.name, idempotent=False)
            async with Worker(scheduler.address, nthreads=1) as a, Worker(scheduler.address, nthreads=1) as b:
                plugin = scheduler.plugins[SidecarPlugin.name]
                await plugin._registered()
                real = plugin.rest.member_env

                async def fails_once(job_id, worker_id):  # a sidecar that stops answering after the create
                    plugin.rest.member_env = real
                    raise SidecarError(0, "cannot reach the sidecar: timed out")

                plugin.rest.member_env = fails_once
                t0 = asyncio.get_running_loop().time()
                answer = await plugin.create_job(workers=[a.address, b.address], owner="test")
                assert "timed out" in answer["error"]
                states = {w["id"]: w["state"] for w in await plugin.rest.workers()}
                assert states == {a.address: "available", b.address: "available"}
                assert asyncio.get_running_loop().time() - t0 < 10  # not the 60 s wiring timeout
                assert plugin.frozen_workers() == set()

    asyncio.run(run())


def test_a_worker_joining_the_pool_while_the_scheduler_closes_is_told_so():
    # A worker restarted during the close asks to join the pool after the plugin began to close:
    # it gets an answer instead of a request to a sidecar that is stopping.
    plugin = SidecarPlugin(url="http://127.0.0.1:9")
    plugin._closed = True
    assert asyncio.run(plugin.join_pool("tcp://127.0.0.1:1", pid=1)) == {"error": "the scheduler is closing",
                                                                          "status": 503}
